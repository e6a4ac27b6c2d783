package workload

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// The script's namespaces, one per scenario. Run creates them with the
// admin client, so their creation is not audited.
const (
	nsContention = "wl-contention"
	nsStampless  = "wl-stampless"
	nsApply      = "wl-apply"
	nsLoops      = "wl-loops"
	nsMisc       = "wl-misc"
	nsElection   = "wl-election"
	nsGone       = "wl-gone"
)

var namespaces = []string{nsContention, nsStampless, nsApply, nsLoops, nsMisc, nsElection, nsGone}

// Thresholds of the script's retry loops: StuckConflicts conflicts that are
// never resolved, ResolvedConflicts that are, and a run of ShortConflicts that
// is resolved before it becomes a loop.
const (
	StuckConflicts    = 7
	ResolvedConflicts = 5
	ShortConflicts    = 4
)

type script struct {
	admin   kubernetes.Interface
	driver  *rest.Config
	rec     *recorder
	clients map[string]kubernetes.Interface
}

// as is writer's client: the driver impersonating writer, recorded. Every
// writer is in writers; newScript built the clients.
func (s *script) as(writer string) kubernetes.Interface { return s.clients[writer] }

// writers are the identities the script impersonates.
var writers = []string{
	"alice", "bob", "carol", "ci-bot", "deployer", "operator", "stale-controller", "flaky-operator",
	"patient-operator", "janitor", "autoscaler", leaderA, leaderB, "reporter", scheduler,
}

// scheduler binds the pod of otherConflict.
const scheduler = "kube-scheduler"

func newScript(admin kubernetes.Interface, driver *rest.Config, rec *recorder) (*script, error) {
	s := &script{admin: admin, driver: driver, rec: rec, clients: map[string]kubernetes.Interface{}}
	for _, w := range writers {
		cfg := rest.CopyConfig(driver)
		cfg.Impersonate = rest.ImpersonationConfig{UserName: w, Groups: []string{"system:masters"}}
		cfg.WrapTransport = rec.wrap
		c, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			return nil, fmt.Errorf("client for %s: %w", w, err)
		}
		s.clients[w] = c
	}
	return s, nil
}

// expect checks that err is the answer with HTTP code want (2xx: no error).
func expect(step string, err error, want int) error {
	got := http.StatusOK
	if err != nil {
		var st apierrors.APIStatus
		if !errors.As(err, &st) {
			return fmt.Errorf("%s: %w", step, err)
		}
		got = int(st.Status().Code)
	}
	if (want < 300) != (got < 300) || (want >= 300 && got != want) {
		return fmt.Errorf("%s: want HTTP %d, got %d: %w", step, want, got, err)
	}
	return nil
}

func cm(ns, name string, data map[string]string) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Data: data}
}

func (s *script) run(ctx context.Context) error {
	for _, step := range []struct {
		name string
		fn   func(context.Context) error
	}{
		{"contention", s.contention},
		{"stampless", s.stampless},
		{"already exists", s.alreadyExists},
		{"other conflict", s.otherConflict},
		{"field conflict", s.fieldConflict},
		{"retry loops", s.retryLoops},
		{"delete precondition", s.deletePrecondition},
		{"scale subresource", s.scale},
		{"leader election", s.leaderElection},
		{"dry run", s.dryRun},
		{"gone", s.gone},
	} {
		if err := step.fn(ctx); err != nil {
			return fmt.Errorf("workload %s: %w", step.name, err)
		}
	}
	return nil
}

// contention: alice, bob and carol read-modify-write one ConfigMap in a
// fixed interleaving. Each round all three read, alice writes first, bob and
// carol conflict; bob re-reads and wins, carol conflicts once more on her
// stale copy, then re-reads and wins. No writer ever has 5 conflicts in a row.
func (s *script) contention(ctx context.Context) error {
	const name = "shared-config"
	alice, bob, carol := s.as("alice"), s.as("bob"), s.as("carol")
	_, err := alice.CoreV1().ConfigMaps(nsContention).Create(ctx, cm(nsContention, name, map[string]string{"round": "0"}), metav1.CreateOptions{})
	if err := expect("alice creates", err, 201); err != nil {
		return err
	}
	get := func(c kubernetes.Interface) (*corev1.ConfigMap, error) {
		return c.CoreV1().ConfigMaps(nsContention).Get(ctx, name, metav1.GetOptions{})
	}
	update := func(c kubernetes.Interface, o *corev1.ConfigMap, who string, round int) error {
		o = o.DeepCopy()
		o.Data[who] = strconv.Itoa(round)
		_, err := c.CoreV1().ConfigMaps(nsContention).Update(ctx, o, metav1.UpdateOptions{})
		return err
	}
	for round := 1; round <= 3; round++ {
		a, err := get(alice)
		if err != nil {
			return fmt.Errorf("alice reads: %w", err)
		}
		b, err := get(bob)
		if err != nil {
			return fmt.Errorf("bob reads: %w", err)
		}
		c, err := get(carol)
		if err != nil {
			return fmt.Errorf("carol reads: %w", err)
		}
		if err := expect("alice writes", update(alice, a, "alice", round), 200); err != nil {
			return err
		}
		if err := expect("bob writes stale", update(bob, b, "bob", round), 409); err != nil {
			return err
		}
		if err := expect("carol writes stale", update(carol, c, "carol", round), 409); err != nil {
			return err
		}
		if b, err = get(bob); err != nil {
			return fmt.Errorf("bob re-reads: %w", err)
		}
		if err := expect("bob writes", update(bob, b, "bob", round), 200); err != nil {
			return err
		}
		if err := expect("carol writes stale again", update(carol, c, "carol", round), 409); err != nil {
			return err
		}
		if c, err = get(carol); err != nil {
			return fmt.Errorf("carol re-reads: %w", err)
		}
		if err := expect("carol writes", update(carol, c, "carol", round), 200); err != nil {
			return err
		}
	}
	return nil
}

// stampless: ci-bot creates a ConfigMap and then PUTs it three times built
// from scratch, without a resourceVersion; deployer does it once on another.
// alice's stamped update of the same object is not stampless.
func (s *script) stampless(ctx context.Context) error {
	ci, deployer, alice := s.as("ci-bot"), s.as("deployer"), s.as("alice")
	_, err := ci.CoreV1().ConfigMaps(nsStampless).Create(ctx, cm(nsStampless, "pipeline-config", map[string]string{"build": "0"}), metav1.CreateOptions{})
	if err := expect("ci-bot creates", err, 201); err != nil {
		return err
	}
	for i := 1; i <= 3; i++ {
		_, err := ci.CoreV1().ConfigMaps(nsStampless).Update(ctx, cm(nsStampless, "pipeline-config", map[string]string{"build": strconv.Itoa(i)}), metav1.UpdateOptions{})
		if err := expect("ci-bot puts without a stamp", err, 200); err != nil {
			return err
		}
	}
	o, err := alice.CoreV1().ConfigMaps(nsStampless).Get(ctx, "pipeline-config", metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("alice reads: %w", err)
	}
	o.Data["reviewed"] = "alice"
	_, err = alice.CoreV1().ConfigMaps(nsStampless).Update(ctx, o, metav1.UpdateOptions{})
	if err := expect("alice updates with a stamp", err, 200); err != nil {
		return err
	}
	_, err = deployer.CoreV1().ConfigMaps(nsStampless).Create(ctx, cm(nsStampless, "feature-flags", map[string]string{"beta": "off"}), metav1.CreateOptions{})
	if err := expect("deployer creates", err, 201); err != nil {
		return err
	}
	_, err = deployer.CoreV1().ConfigMaps(nsStampless).Update(ctx, cm(nsStampless, "feature-flags", map[string]string{"beta": "on"}), metav1.UpdateOptions{})
	return expect("deployer puts without a stamp", err, 200)
}

// alreadyExists: deployer creates app-config, then creates it twice more.
func (s *script) alreadyExists(ctx context.Context) error {
	d := s.as("deployer")
	for i, want := range []int{201, 409, 409} {
		_, err := d.CoreV1().ConfigMaps(nsMisc).Create(ctx, cm(nsMisc, "app-config", map[string]string{"try": strconv.Itoa(i)}), metav1.CreateOptions{})
		if err := expect("deployer creates app-config", err, want); err != nil {
			return err
		}
	}
	return nil
}

// otherConflict: the scheduler creates a pod and binds it to a node, then
// binds it again: the apiserver answers 409 Conflict ("pod ... is already
// assigned to node ..."), a conflict that is none of the named kinds. The
// admin client creates the namespace's default service account, which the
// ServiceAccount admission plugin requires (no controller manager here).
func (s *script) otherConflict(ctx context.Context) error {
	_, err := s.admin.CoreV1().ServiceAccounts(nsMisc).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("default service account: %w", err)
	}
	pods := s.as(scheduler).CoreV1().Pods(nsMisc)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: nsMisc, Name: "batch-job"}, Spec: corev1.PodSpec{
		AutomountServiceAccountToken: ptrTo(false),
		Containers:                   []corev1.Container{{Name: "job", Image: "registry.example/job:1"}},
	}}
	_, err = pods.Create(ctx, pod, metav1.CreateOptions{})
	if err := expect("scheduler creates batch-job", err, 201); err != nil {
		return err
	}
	for _, want := range []int{201, 409} {
		err := pods.Bind(ctx, &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Namespace: nsMisc, Name: "batch-job"},
			Target: corev1.ObjectReference{Kind: "Node", Name: "node-a"}}, metav1.CreateOptions{})
		if err := expect("scheduler binds batch-job", err, want); err != nil {
			return err
		}
	}
	return nil
}

func ptrTo[T any](v T) *T { return &v }

// fieldConflict: alice's alice-tool applies .data.x; bob's bob-tool applies
// another value and conflicts; bob forces; alice re-applies and conflicts.
func (s *script) fieldConflict(ctx context.Context) error {
	apply := func(writer, manager, x string, force bool, want int) error {
		ac := corev1ac.ConfigMap("tuning", nsApply).WithData(map[string]string{"x": x})
		_, err := s.as(writer).CoreV1().ConfigMaps(nsApply).Apply(ctx, ac, metav1.ApplyOptions{FieldManager: manager, Force: force})
		return expect(fmt.Sprintf("%s applies x=%s (force %t)", manager, x, force), err, want)
	}
	return errors.Join(
		apply("alice", "alice-tool", "1", false, 201),
		apply("bob", "bob-tool", "2", false, 409),
		apply("bob", "bob-tool", "2", true, 200),
		apply("alice", "alice-tool", "1", false, 409),
	)
}

// retryLoops: stale-controller read its object once and keeps PUTting that
// stale copy (StuckConflicts conflicts, never resolved); flaky-operator
// conflicts ResolvedConflicts times, re-reads and succeeds; patient-operator
// conflicts ShortConflicts times, below the loop threshold, and succeeds.
func (s *script) retryLoops(ctx context.Context) error {
	owner := s.as("operator")
	for _, c := range []struct {
		writer, object string
		conflicts      int
		resolve        bool
	}{
		{"stale-controller", "stuck-target", StuckConflicts, false},
		{"flaky-operator", "flaky-target", ResolvedConflicts, true},
		{"patient-operator", "patient-target", ShortConflicts, true},
	} {
		w, o := s.as(c.writer).CoreV1().ConfigMaps(nsLoops), owner.CoreV1().ConfigMaps(nsLoops)
		_, err := o.Create(ctx, cm(nsLoops, c.object, map[string]string{"gen": "0"}), metav1.CreateOptions{})
		if err := expect("operator creates "+c.object, err, 201); err != nil {
			return err
		}
		stale, err := w.Get(ctx, c.object, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("%s reads: %w", c.writer, err)
		}
		fresh := stale.DeepCopy()
		fresh.Data["gen"] = "1"
		if _, err := o.Update(ctx, fresh, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("operator updates %s: %w", c.object, err)
		}
		stale.Data[c.writer] = "mine"
		for range c.conflicts {
			_, err := w.Update(ctx, stale, metav1.UpdateOptions{})
			if err := expect(c.writer+" writes its stale copy", err, 409); err != nil {
				return err
			}
		}
		if !c.resolve {
			continue
		}
		cur, err := w.Get(ctx, c.object, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("%s re-reads: %w", c.writer, err)
		}
		cur.Data[c.writer] = "mine"
		_, err = w.Update(ctx, cur, metav1.UpdateOptions{})
		if err := expect(c.writer+" writes", err, 200); err != nil {
			return err
		}
	}
	return nil
}

// deletePrecondition: janitor learns rotated's uid; deployer deletes and
// re-creates it (a new uid); janitor's delete with the old uid conflicts,
// then it re-reads and deletes with the current uid.
func (s *script) deletePrecondition(ctx context.Context) error {
	janitor, deployer := s.as("janitor"), s.as("deployer")
	const name = "rotated"
	_, err := deployer.CoreV1().ConfigMaps(nsMisc).Create(ctx, cm(nsMisc, name, map[string]string{"v": "1"}), metav1.CreateOptions{})
	if err := expect("deployer creates rotated", err, 201); err != nil {
		return err
	}
	old, err := janitor.CoreV1().ConfigMaps(nsMisc).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("janitor reads: %w", err)
	}
	if err := expect("deployer deletes rotated", deployer.CoreV1().ConfigMaps(nsMisc).Delete(ctx, name, metav1.DeleteOptions{}), 200); err != nil {
		return err
	}
	_, err = deployer.CoreV1().ConfigMaps(nsMisc).Create(ctx, cm(nsMisc, name, map[string]string{"v": "2"}), metav1.CreateOptions{})
	if err := expect("deployer re-creates rotated", err, 201); err != nil {
		return err
	}
	err = janitor.CoreV1().ConfigMaps(nsMisc).Delete(ctx, name, metav1.DeleteOptions{Preconditions: metav1.NewUIDPreconditions(string(old.UID))})
	if err := expect("janitor deletes with the old uid", err, 409); err != nil {
		return err
	}
	cur, err := janitor.CoreV1().ConfigMaps(nsMisc).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("janitor re-reads: %w", err)
	}
	err = janitor.CoreV1().ConfigMaps(nsMisc).Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &cur.UID}})
	return expect("janitor deletes with the current uid", err, 200)
}

// scale: writes through a Deployment's scale subresource count for the
// Deployment. autoscaler sets replicas without a stamp (stampless, as an
// autoscaler that builds its Scale from scratch would), then with a stale
// one (a version conflict), then re-reads and succeeds.
func (s *script) scale(ctx context.Context) error {
	const name = "web"
	deployer, autoscaler := s.as("deployer"), s.as("autoscaler")
	labels := map[string]string{"app": name}
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: nsMisc, Name: name},
		Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "web", Image: "registry.k8s.io/pause:3.10"}}},
			},
		},
	}
	_, err := deployer.AppsV1().Deployments(nsMisc).Create(ctx, d, metav1.CreateOptions{})
	if err := expect("deployer creates web", err, 201); err != nil {
		return err
	}
	deployments := autoscaler.AppsV1().Deployments(nsMisc)
	stale, err := deployments.GetScale(ctx, name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("autoscaler reads the scale: %w", err)
	}
	scale := func(replicas int32, rv string) error {
		sc := &autoscalingv1.Scale{ObjectMeta: metav1.ObjectMeta{Namespace: nsMisc, Name: name, ResourceVersion: rv}, Spec: autoscalingv1.ScaleSpec{Replicas: replicas}}
		_, err := deployments.UpdateScale(ctx, name, sc, metav1.UpdateOptions{})
		return err
	}
	if err := expect("autoscaler scales without a stamp", scale(3, ""), 200); err != nil {
		return err
	}
	if err := expect("autoscaler scales with a stale stamp", scale(4, stale.ResourceVersion), 409); err != nil {
		return err
	}
	cur, err := deployments.GetScale(ctx, name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("autoscaler re-reads the scale: %w", err)
	}
	return expect("autoscaler scales", scale(4, cur.ResourceVersion), 200)
}

// The lease of the leader election scenario and its expected holders.
const (
	LeaseName = "stampguard-leader"
	leaderA   = "leader-a"
	leaderB   = "leader-b"
)

// leaderElection plays a Lease the way client-go's leader election writes
// it: leader-a acquires and renews; leader-b takes over (a change);
// leader-a's renewal of its stale copy conflicts; leader-b renews, releases
// (empty holder: no change), re-acquires (same holder: no change) and
// releases; leader-a acquires again (a change). Holders: a, b, a.
func (s *script) leaderElection(ctx context.Context) error {
	a, b := s.as(leaderA).CoordinationV1().Leases(nsElection), s.as(leaderB).CoordinationV1().Leases(nsElection)
	now := func() *metav1.MicroTime { t := metav1.NowMicro(); return &t }
	hold := func(l *coordinationv1.Lease, holder string) *coordinationv1.Lease {
		l = l.DeepCopy()
		h := holder
		l.Spec.HolderIdentity = &h
		l.Spec.RenewTime = now()
		if holder != "" {
			d := int32(15)
			l.Spec.LeaseDurationSeconds = &d
		}
		return l
	}
	la, err := a.Create(ctx, hold(&coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: LeaseName, Namespace: nsElection}}, leaderA), metav1.CreateOptions{})
	if err := expect("leader-a acquires", err, 201); err != nil {
		return err
	}
	for range 3 {
		if la, err = a.Update(ctx, hold(la, leaderA), metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("leader-a renews: %w", err)
		}
	}
	lb, err := b.Get(ctx, LeaseName, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("leader-b reads: %w", err)
	}
	if lb, err = b.Update(ctx, hold(lb, leaderB), metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("leader-b takes over: %w", err)
	}
	_, err = a.Update(ctx, hold(la, leaderA), metav1.UpdateOptions{})
	if err := expect("leader-a renews its stale copy", err, 409); err != nil {
		return err
	}
	if _, err := a.Get(ctx, LeaseName, metav1.GetOptions{}); err != nil {
		return fmt.Errorf("leader-a re-reads: %w", err)
	}
	for _, h := range []string{leaderB, "", leaderB, ""} {
		if lb, err = b.Update(ctx, hold(lb, h), metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("leader-b sets holder %q: %w", h, err)
		}
	}
	if la, err = a.Get(ctx, LeaseName, metav1.GetOptions{}); err != nil {
		return fmt.Errorf("leader-a reads: %w", err)
	}
	if _, err = a.Update(ctx, hold(la, leaderA), metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("leader-a acquires again: %w", err)
	}
	return nil
}

// dryRun: writes that the report must ignore, including a dry-run version
// conflict, a dry-run create of an existing name and a dry-run stampless PUT.
func (s *script) dryRun(ctx context.Context) error {
	alice := s.as("alice")
	dry := []string{metav1.DryRunAll}
	cms := alice.CoreV1().ConfigMaps(nsContention)
	_, err := cms.Create(ctx, cm(nsContention, "never-stored", nil), metav1.CreateOptions{DryRun: dry})
	if err := expect("dry-run create", err, 201); err != nil {
		return err
	}
	_, err = cms.Create(ctx, cm(nsContention, "shared-config", nil), metav1.CreateOptions{DryRun: dry})
	if err := expect("dry-run create of an existing name", err, 409); err != nil {
		return err
	}
	stale := cm(nsContention, "shared-config", map[string]string{"dry": "run"})
	stale.ResourceVersion = "1"
	_, err = cms.Update(ctx, stale, metav1.UpdateOptions{DryRun: dry})
	if err := expect("dry-run stale update", err, 409); err != nil {
		return err
	}
	_, err = cms.Update(ctx, cm(nsContention, "shared-config", map[string]string{"dry": "run"}), metav1.UpdateOptions{DryRun: dry})
	return expect("dry-run stampless update", err, 200)
}

// gone: reporter lists a page of ConfigMaps, waits for etcd to compact past
// that list's resourceVersion, then lists at it exactly and continues the
// list: both answer 410 Expired. The admin client seeds and polls, unaudited.
func (s *script) gone(ctx context.Context) error {
	for i := range 5 {
		if _, err := s.admin.CoreV1().ConfigMaps(nsGone).Create(ctx, cm(nsGone, fmt.Sprintf("item-%d", i), nil), metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("seed: %w", err)
		}
	}
	r := s.as("reporter").CoreV1().ConfigMaps(nsGone)
	page, err := r.List(ctx, metav1.ListOptions{Limit: 2})
	if err != nil {
		return fmt.Errorf("reporter lists a page: %w", err)
	}
	if page.Continue == "" {
		return errors.New("reporter's first page has no continue token")
	}
	exact := metav1.ListOptions{ResourceVersion: page.ResourceVersion, ResourceVersionMatch: metav1.ResourceVersionMatchExact}
	cont := metav1.ListOptions{Limit: 2, Continue: page.Continue}
	if err := s.waitCompacted(ctx, exact, cont); err != nil {
		return err
	}
	_, err = r.List(ctx, exact)
	if err := expect("reporter lists at a compacted resourceVersion", err, 410); err != nil {
		return err
	}
	_, err = r.List(ctx, cont)
	return expect("reporter continues an expired list", err, 410)
}

// waitCompacted polls with the (unaudited) admin client until both lists
// answer 410, touching a ConfigMap so that etcd's revision moves on.
func (s *script) waitCompacted(ctx context.Context, lists ...metav1.ListOptions) error {
	ctx, cancel := context.WithTimeoutCause(ctx, time.Minute, errors.New("etcd compaction did not pass the listed resourceVersion"))
	defer cancel()
	adm := s.admin.CoreV1().ConfigMaps(nsGone)
	for i := 0; ; i++ {
		gone := 0
		for _, o := range lists {
			if _, err := adm.List(ctx, o); apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
				gone++
			}
		}
		if gone == len(lists) {
			return nil
		}
		if _, err := adm.Update(ctx, cm(nsGone, "item-0", map[string]string{"tick": strconv.Itoa(i)}), metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("touch: %w", err)
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(250 * time.Millisecond):
		}
	}
}
