// Package contention runs, for a while, writers that fight over a shop's
// objects the way they do in real clusters. Every writer is a client-go
// client from workload.Recorder, so the run's ground truth is what the
// clients saw:
//
//   - three controllers read-modify-write one ConfigMap, with retry on conflict;
//   - the autoscaler writes the Deployment's replicas through /scale;
//   - a kubectl-like script PUTs manifests without resourceVersion: refused
//     in the guarded namespace, audited in the legacy one;
//   - a stuck operator keeps PUTting one stale copy (an unresolved retry loop);
//   - two workers elect a leader through a Lease, and the first one's crash
//     hands it to the second;
//   - a deploy tool PUTs its manifest, trips the replicas owner (and once the
//     immutable team label), then drops those fields and retries;
//   - in the legacy namespace, where nothing is enforced, the on-call SRE
//     raises a timeout and turns a flag on, a release bot `kubectl
//     replace`s its stale manifest over the timeout and the script's
//     stampless PUTs drop the flag (two lost updates a cycle), and a GitOps
//     controller keeps setting the replicas the autoscaler keeps changing
//     (a field fight with no conflict at all).
//
// The policies the run meets are examples/demo-policies.yaml (`make demo`
// applies them); Truth knows what its Audit-mode policy records.
package contention

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"github.com/stampguard/stampguard/analytics/report"
	wl "github.com/stampguard/stampguard/test/workload"
)

// The namespaces of the run: Shop is guarded by Deny policies, Legacy only
// by the Audit-mode one.
const (
	Shop   = "shop"
	Legacy = "legacy"
)

// The objects the writers fight over.
const (
	Deployment = "web"
	Catalog    = "catalog"       // the controllers' ConfigMap
	Flags      = "feature-flags" // the script's ConfigMap, in both namespaces
	Checkout   = "checkout"      // the release bot's ConfigMap, in Legacy
	Lease      = "billing-leader"
)

// The writers' identities, as the report names them.
const (
	Autoscaler    = "system:serviceaccount:kube-system:horizontal-pod-autoscaler"
	Script        = "alice"
	StuckOperator = "legacy-operator"
	DeployTool    = "deploy-tool"
	WorkerA       = "billing-worker-1"
	WorkerB       = "billing-worker-2"
	OnCall        = "oncall-sre"
	ReleaseBot    = "release-bot"
	GitOps        = "system:serviceaccount:argocd:argocd-application-controller"
)

// The fields of the legacy namespace's lost updates: the timeout the
// release bot's manifest resets and the flag the script's PUTs drop.
const (
	TimeoutKey = "timeout"
	SearchFlag = "search"
)

// GitOpsReplicas is the replica count in the GitOps controller's manifest
// of Legacy's Deployment; the autoscaler's curve never reaches it.
const GitOpsReplicas = 2

// Controllers are the three writers in read-modify-write contention.
var Controllers = []string{"controller-a", "controller-b", "controller-c"}

// AuditPolicyName is the Audit-mode policy of examples/demo-policies.yaml:
// stampless updates of ConfigMaps in Legacy are let through and recorded.
const AuditPolicyName = "legacy-configmaps"

// Options shape a run.
type Options struct {
	// Duration is how long the writers write. Defaults to 1m; at least 10s,
	// so that the leader election sees its takeover.
	Duration time.Duration
	// AuditLogPath is the apiserver's audit log, copied into the Result.
	AuditLogPath string
	// Status, when set, is called about once a second while the writers run.
	Status func(Stats)
}

// Stats are the counts so far, from the recorded requests.
type Stats struct {
	Elapsed, Duration time.Duration
	// Writes are write attempts, Conflicts version conflicts (409), Refusals
	// writes that stampguard refused (422 from its webhooks).
	Writes, Conflicts, Refusals int
}

// MinDuration is the shortest run Run accepts.
const MinDuration = 10 * time.Second

// Run creates the driver account, the namespaces and the objects with
// admin (not audited under workload.AuditPolicy), runs every writer for
// o.Duration, and returns the requests with their truth. It returns an
// error when a writer got an answer that is not part of the story (a
// transport error, a 500, ...).
func Run(ctx context.Context, admin *rest.Config, o Options) (*wl.Result, error) {
	if o.Duration == 0 {
		o.Duration = time.Minute
	}
	if o.Duration < MinDuration {
		return nil, fmt.Errorf("contention: duration %s is shorter than %s", o.Duration, MinDuration)
	}
	rec, err := wl.NewRecorder(ctx, admin)
	if err != nil {
		return nil, err
	}
	if err := seed(ctx, admin); err != nil {
		return nil, err
	}
	clients := map[string]kubernetes.Interface{}
	for _, w := range append([]string{Autoscaler, Script, StuckOperator, DeployTool, WorkerA, WorkerB, OnCall, ReleaseBot, GitOps}, Controllers...) {
		if clients[w], err = rec.Client(w); err != nil {
			return nil, err
		}
	}
	r := &run{clients: clients, rec: rec, stop: make(chan struct{}), start: time.Now(), o: o}

	since := time.Now().UTC().Truncate(time.Microsecond)
	var wg sync.WaitGroup
	errs := make([]error, 0, 8)
	var mu sync.Mutex
	goWriter := func(name string, fn func(context.Context) error) {
		wg.Go(func() {
			if err := fn(ctx); err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("%s: %w", name, err))
				mu.Unlock()
			}
		})
	}
	for i, c := range Controllers {
		goWriter(c, func(ctx context.Context) error { return r.controller(ctx, c, int64(i)) })
	}
	goWriter("autoscaler", r.autoscaler)
	goWriter("script", r.script)
	goWriter("stuck operator", r.stuckOperator)
	goWriter("deploy tool", r.deployTool)
	goWriter("leader election", r.leaderElection)
	goWriter("incident", r.incident)
	goWriter("gitops", r.gitops)

	timer := time.NewTimer(o.Duration)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
loop:
	for {
		select {
		case <-timer.C:
			break loop
		case <-ctx.Done():
			timer.Stop()
			break loop
		case <-tick.C:
			if o.Status != nil {
				o.Status(r.stats())
			}
		}
	}
	close(r.stop)
	wg.Wait()
	if o.Status != nil {
		o.Status(r.stats())
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, context.Cause(ctx)
	}
	// The apiserver writes an event's last stage just after the client has
	// the response; five seconds of slack keep it inside the window.
	until := time.Now().UTC().Add(5 * time.Second).Truncate(time.Microsecond)
	res := &wl.Result{Requests: rec.Requests(), Since: since, Until: until, AuditLogPath: o.AuditLogPath}
	for i, q := range res.Requests {
		if q.AuditID == "" {
			return nil, fmt.Errorf("request %d (%s %s %s/%s) has no Audit-Id header", i, q.Verb, q.Resource, q.Namespace, q.Name)
		}
	}
	res.Truth, res.Loops = Truth(res.Requests, since, until)
	return res, nil
}

// Truth is the report `auditsink report` must print for these requests:
// workload.Truth, with the policy decisions of examples/demo-policies.yaml
// (the refusals the clients got, and what the Audit-mode policy records).
func Truth(reqs []wl.Request, since, until time.Time) (report.Report, []wl.LoopBounds) {
	rep, loops := wl.Truth(reqs, since, until, wl.LoopOptions{})
	rep.PolicyDecisions = wl.PolicyDecisions(reqs, since, until, Audited)
	return rep, loops
}

// Audited is what the Audit-mode policy records for a request: a stampless
// update of a ConfigMap in Legacy that went through.
func Audited(r wl.Request) []report.PolicyDecisions {
	if r.Verb == "update" && r.APIGroup == "" && r.Resource == "configmaps" && r.Subresource == "" &&
		r.Namespace == Legacy && r.Stamp == "" && r.Succeeded() {
		return []report.PolicyDecisions{{Policy: AuditPolicyName, Kind: "stamp-missing", Action: "audit", Count: 1}}
	}
	return nil
}

// Count turns recorded requests into Stats counts.
func Count(reqs []wl.Request) (writes, conflicts, refusals int) {
	for _, q := range reqs {
		if !wl.IsWriteAttempt(q) {
			continue
		}
		writes++
		if wl.Classify(q) == wl.KindVersionConflict {
			conflicts++
		}
		if len(wl.Refusals(q)) > 0 {
			refusals++
		}
	}
	return writes, conflicts, refusals
}

type run struct {
	// manifest keeps the autoscaler away while the deploy tool reads the
	// Deployment and PUTs its manifest over it. A PUT that loses that race
	// is answered 409 even when the webhook refused it: the apiserver first
	// tries the write on its cached copy, where the webhook refuses it, then
	// retries on the current object and answers the conflict. Its audit
	// event keeps the refusal's annotation, which the client never saw, so
	// the report's policy decisions could not be known from the client.
	manifest sync.Mutex
	clients  map[string]kubernetes.Interface
	rec      *wl.Recorder
	stop     chan struct{}
	start    time.Time
	o        Options
}

func (r *run) stats() Stats {
	s := Stats{Elapsed: time.Since(r.start), Duration: r.o.Duration}
	s.Writes, s.Conflicts, s.Refusals = Count(r.rec.Requests())
	return s
}

// pause waits d and reports whether the run goes on.
func (r *run) pause(d time.Duration) bool {
	select {
	case <-r.stop:
		return false
	case <-time.After(d):
		return true
	}
}

func (r *run) stopped() bool {
	select {
	case <-r.stop:
		return true
	default:
		return false
	}
}

// storyError passes the answers that are part of the story (conflicts,
// refusals) and returns the others.
func storyError(err error) error {
	var st apierrors.APIStatus
	if err == nil || (errors.As(err, &st) && st.Status().Code < 500) {
		return nil
	}
	return err
}

func labels() map[string]string { return map[string]string{"app": Deployment} }

func webDeployment(image string, replicas int32, team string) *appsv1.Deployment {
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: Shop, Name: Deployment, Labels: map[string]string{"team": team}},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(replicas),
			Selector: &metav1.LabelSelector{MatchLabels: labels()},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels()},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "web", Image: image}}},
			},
		},
	}
}

func configMap(ns, name string, data map[string]string) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Data: data}
}

// seed creates what the writers start from, as the admin.
func seed(ctx context.Context, admin *rest.Config) error {
	cs, err := kubernetes.NewForConfig(admin)
	if err != nil {
		return fmt.Errorf("admin client: %w", err)
	}
	for _, ns := range []string{Shop, Legacy} {
		if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create namespace %s: %w", ns, err)
		}
	}
	for _, ns := range []string{Shop, Legacy} {
		d := webDeployment("registry.example/web:1.0", 3, "storefront")
		d.Namespace = ns
		if _, err := cs.AppsV1().Deployments(ns).Create(ctx, d, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create deployment %s/%s: %w", ns, Deployment, err)
		}
	}
	for _, c := range []*corev1.ConfigMap{
		configMap(Shop, Catalog, map[string]string{}),
		configMap(Shop, Flags, map[string]string{"checkout": "v1"}),
		configMap(Legacy, Flags, map[string]string{"checkout": "v1"}),
		releaseManifest(),
	} {
		if _, err := cs.CoreV1().ConfigMaps(c.Namespace).Create(ctx, c, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create configmap %s/%s: %w", c.Namespace, c.Name, err)
		}
	}
	return nil
}

// controller reconciles the catalog: read, think, write its own key;
// client-go's RetryOnConflict re-reads after a conflict, up to five times.
func (r *run) controller(ctx context.Context, me string, stream int64) error {
	rnd := rand.New(rand.NewPCG(uint64(stream), 7))
	cms := r.clients[me].CoreV1().ConfigMaps(Shop)
	for n := 1; !r.stopped(); n++ {
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			cm, err := cms.Get(ctx, Catalog, metav1.GetOptions{})
			if err != nil {
				return err
			}
			time.Sleep(time.Duration(20+rnd.IntN(40)) * time.Millisecond) // reconciling
			if cm.Data == nil {
				cm.Data = map[string]string{}
			}
			cm.Data[me] = strconv.Itoa(n)
			_, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
			return err
		})
		if err := storyError(err); err != nil {
			return err
		}
		if !r.pause(time.Duration(100+rnd.IntN(200)) * time.Millisecond) {
			return nil
		}
	}
	return nil
}

// autoscaler follows a load curve through the scale subresource, on the
// Deployment of both namespaces.
func (r *run) autoscaler(ctx context.Context) error {
	curve := []int32{4, 5, 6, 5}
	scale := func(ns string, replicas int32) error {
		d := r.clients[Autoscaler].AppsV1().Deployments(ns)
		return retry.RetryOnConflict(retry.DefaultRetry, func() error {
			s, err := d.GetScale(ctx, Deployment, metav1.GetOptions{})
			if err != nil {
				return err
			}
			s.Spec.Replicas = replicas
			_, err = d.UpdateScale(ctx, Deployment, s, metav1.UpdateOptions{})
			return err
		})
	}
	for i := 0; ; i++ {
		r.manifest.Lock()
		err := scale(Shop, curve[i%len(curve)])
		r.manifest.Unlock()
		if err := storyError(err); err != nil {
			return err
		}
		if err := storyError(scale(Legacy, curve[i%len(curve)])); err != nil {
			return err
		}
		if !r.pause(1500 * time.Millisecond) {
			return nil
		}
	}
}

// incident is the legacy namespace's lost updates, in cycles: the on-call
// SRE raises the checkout timeout and turns the search flag on, each a
// stamped read-modify-write; a second later the release bot replaces the
// checkout ConfigMap with its manifest as `kubectl replace -f` does (GET
// the live object, copy its resourceVersion into the manifest, PUT it with
// field manager kubectl-replace): the stamp is fresh, the content stale,
// and the timeout goes back. The script's next stampless PUT of the flags
// drops the flag.
func (r *run) incident(ctx context.Context) error {
	edit := func(name string, change func(map[string]string)) error {
		cms := r.clients[OnCall].CoreV1().ConfigMaps(Legacy)
		return retry.RetryOnConflict(retry.DefaultRetry, func() error {
			cm, err := cms.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if cm.Data == nil {
				cm.Data = map[string]string{}
			}
			change(cm.Data)
			_, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
			return err
		})
	}
	bot := r.clients[ReleaseBot].CoreV1().ConfigMaps(Legacy)
	for n := 1; r.pause(time.Second); n++ {
		err := edit(Checkout, func(d map[string]string) { d[TimeoutKey] = strconv.Itoa(10+n) + "s" })
		if err := storyError(err); err != nil {
			return err
		}
		err = edit(Flags, func(d map[string]string) { d[SearchFlag] = "on" })
		if err := storyError(err); err != nil {
			return err
		}
		if !r.pause(time.Second) {
			return nil
		}
		live, err := bot.Get(ctx, Checkout, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("read the checkout config: %w", err)
		}
		manifest := releaseManifest()
		manifest.ResourceVersion = live.ResourceVersion
		_, err = bot.Update(ctx, manifest, metav1.UpdateOptions{FieldManager: "kubectl-replace"})
		if err := storyError(err); err != nil {
			return err
		}
	}
	return nil
}

// releaseManifest is the release bot's checkout ConfigMap.
func releaseManifest() *corev1.ConfigMap {
	return configMap(Legacy, Checkout, map[string]string{TimeoutKey: "5s", "retries": "3"})
}

// gitops syncs Legacy's Deployment to its manifest's replicas every two
// seconds, a stamped read-modify-write with retry; the autoscaler changes
// them back in between. No write is blind and none conflicts for long:
// the field just flaps.
func (r *run) gitops(ctx context.Context) error {
	d := r.clients[GitOps].AppsV1().Deployments(Legacy)
	for r.pause(2 * time.Second) {
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			live, err := d.Get(ctx, Deployment, metav1.GetOptions{})
			if err != nil {
				return err
			}
			live.Spec.Replicas = ptr.To(int32(GitOpsReplicas))
			_, err = d.Update(ctx, live, metav1.UpdateOptions{FieldManager: "argocd-controller"})
			return err
		})
		if err := storyError(err); err != nil {
			return err
		}
	}
	return nil
}

// script PUTs manifests built from scratch, without resourceVersion, the way
// a script that curls YAML does: refused in Shop, audited in Legacy.
func (r *run) script(ctx context.Context) error {
	c := r.clients[Script]
	for i := 1; ; i++ {
		data := map[string]string{"checkout": "v" + strconv.Itoa(i%3+1)}
		for _, ns := range []string{Shop, Legacy} {
			_, err := c.CoreV1().ConfigMaps(ns).Update(ctx, configMap(ns, Flags, data), metav1.UpdateOptions{})
			if err := storyError(err); err != nil {
				return err
			}
		}
		if i%3 == 0 {
			_, err := c.AppsV1().Deployments(Shop).Update(ctx, webDeployment("registry.example/web:hotfix", 3, "storefront"), metav1.UpdateOptions{})
			if err := storyError(err); err != nil {
				return err
			}
		}
		if !r.pause(2 * time.Second) {
			return nil
		}
	}
}

// stuckOperator read the catalog once and keeps PUTting that stale copy,
// backing off a little but never re-reading: a retry loop that never ends.
func (r *run) stuckOperator(ctx context.Context) error {
	cms := r.clients[StuckOperator].CoreV1().ConfigMaps(Shop)
	stale, err := cms.Get(ctx, Catalog, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("read the catalog: %w", err)
	}
	if stale.Data == nil {
		stale.Data = map[string]string{}
	}
	stale.Data["owner"] = StuckOperator
	for r.pause(700 * time.Millisecond) {
		_, err := cms.Update(ctx, stale, metav1.UpdateOptions{})
		if err := storyError(err); err != nil {
			return err
		}
	}
	return nil
}

// deployTool rolls out a new image every few seconds by PUTting its
// manifest over the live object (replicas 3, team storefront). The
// autoscaler owns replicas, so the webhook refuses; the tool's operator
// drops the field and the tool retries on conflict. The third rollout's
// manifest also renames the team, which the immutable label refuses.
func (r *run) deployTool(ctx context.Context) error {
	d := r.clients[DeployTool].AppsV1().Deployments(Shop)
	opts := metav1.UpdateOptions{FieldManager: DeployTool}
	for n := 1; r.pause(3 * time.Second); n++ {
		image := "registry.example/web:1." + strconv.Itoa(n)
		r.manifest.Lock()
		live, err := d.Get(ctx, Deployment, metav1.GetOptions{})
		if err != nil {
			r.manifest.Unlock()
			return fmt.Errorf("read the deployment: %w", err)
		}
		team := "storefront"
		if n == 3 {
			team = "checkout" // a reorg that reached the manifest
		}
		manifest := webDeployment(image, 3, team)
		manifest.ObjectMeta = live.ObjectMeta // a stamped PUT of the whole manifest
		manifest.Labels = map[string]string{"team": team}
		_, err = d.Update(ctx, manifest, opts)
		r.manifest.Unlock()
		if !apierrors.IsInvalid(err) { // refused: the label is immutable
			if err := storyError(err); err != nil {
				return err
			}
			continue
		}
		err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
			live, err := d.Get(ctx, Deployment, metav1.GetOptions{})
			if err != nil {
				return err
			}
			live.Spec.Template.Spec.Containers[0].Image = image
			_, err = d.Update(ctx, live, opts)
			return err
		})
		if err := storyError(err); err != nil {
			return err
		}
	}
	return nil
}

// leaseDuration is the leader election's lease: short, so that the
// takeover happens within a short run.
const leaseDuration = 3 * time.Second

// leaderElection runs client-go's leader election for two workers. The
// first leads until half time, then crashes (it stops renewing without
// releasing) and comes back as a follower; the second takes over once the
// lease expires.
func (r *run) leaderElection(ctx context.Context) error {
	elect := func(ctx context.Context, id string, release bool) error {
		le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock: &resourcelock.LeaseLock{
				LeaseMeta:  metav1.ObjectMeta{Namespace: Shop, Name: Lease},
				Client:     r.clients[id].CoordinationV1(),
				LockConfig: resourcelock.ResourceLockConfig{Identity: id},
			},
			LeaseDuration: leaseDuration, RenewDeadline: 2 * time.Second, RetryPeriod: 500 * time.Millisecond,
			ReleaseOnCancel: release,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(context.Context) {},
				OnStoppedLeading: func() {},
			},
		})
		if err != nil {
			return fmt.Errorf("%s: %w", id, err)
		}
		le.Run(ctx)
		return nil
	}
	whole, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-r.stop:
		case <-whole.Done():
		}
		cancel()
	}()
	first, crash := context.WithCancel(whole)
	defer crash()
	doneA := make(chan error, 1)
	go func() { doneA <- elect(first, WorkerA, false) }()
	if !r.pause(time.Second) {
		crash()
		return <-doneA
	}
	doneB := make(chan error, 1)
	go func() { doneB <- elect(whole, WorkerB, true) }()
	var errA, errA2 error
	var doneA2 chan error
	if r.pause(r.o.Duration/2 - time.Second) {
		crash() // worker-1 stops renewing and does not release
		errA = <-doneA
		// It comes back once worker-2 holds the lease: back earlier, it
		// would find its own name on the lease and simply renew.
		if r.pause(2 * leaseDuration) {
			doneA2 = make(chan error, 1)
			go func() { doneA2 <- elect(whole, WorkerA, true) }()
		}
	} else {
		crash()
		errA = <-doneA
	}
	<-whole.Done()
	errB := <-doneB
	if doneA2 != nil {
		errA2 = <-doneA2
	}
	return errors.Join(errA, errB, errA2)
}
