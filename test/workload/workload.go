// Package workload drives a real kube-apiserver with a fixed script of
// writers that conflict in every way issue 4 defines, and records the
// ground truth of what happened from the client's side only: every request,
// keyed by its Audit-Id response header, with the status the client got.
// Truth turns those records into the report.Report that `auditsink report`
// must print for the audit log of the same run.
//
// Use it so:
//
//	env := kubetest.Start(t, workload.KubetestOptions())
//	res, err := workload.Run(t.Context(), env)
//	events, err := res.WaitAudited(t.Context()) // the log has caught up
//	want, err := res.TruthAt(events)            // loop times as the apiserver saw them
//
// then ingest res.AuditLogPath, run `auditsink report --format json` with
// --since and --until set to res.Since and res.Until (TimeFormat) and a
// --top no shorter than want.HotObjects, and compare the whole report.
//
// Other workloads record the same way through a Recorder (NewRecorder):
// test/workload/contention, the timed run of contending writers that
// `make demo` plays, is one; PolicyDecisions adds the policy section that
// stampguard's webhook contributes to the truth.
//
// The workload authenticates as its own service account (DriverUser) and
// impersonates each writer, so that AuditPolicy can log its requests and
// nothing else: the apiserver's own leases, envtest's setup and the test's
// admin client never reach the audit log, and the log's totals are exact.
package workload

import (
	"context"
	"errors"
	"fmt"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/stampguard/stampguard/analytics/report"
	"github.com/stampguard/stampguard/test/kubetest"
)

// The service account the workload authenticates as. Only its requests are
// audited (AuditPolicy); every one of them impersonates a writer.
const (
	DriverNamespace = "stampguard-workload"
	DriverName      = "driver"
	DriverUser      = "system:serviceaccount:" + DriverNamespace + ":" + DriverName
)

// AuditPolicy logs the driver's requests at level Request, every stage, and
// nothing else. Audit policy rules match the authenticated user, before
// impersonation (the audit filter runs outside the impersonation filter), so
// the rule names the driver, not the writers it impersonates.
const AuditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
rules:
- level: Request
  users: ["` + DriverUser + `"]
- level: None
`

// RequestResponseAuditPolicy is AuditPolicy at level RequestResponse, the
// level docs/audit-policy.yaml recommends for writes: each event holds the
// object as stored too, from which `webhook replay` rebuilds the objects'
// states. The demo logs so.
const RequestResponseAuditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
rules:
- level: RequestResponse
  users: ["` + DriverUser + `"]
- level: None
`

// CompactionInterval is the etcd compaction interval KubetestOptions sets,
// short so that the script can list at a compacted resourceVersion.
const CompactionInterval = time.Second

// KubetestOptions start a control plane for Run: AuditPolicy, an audit log
// file, and etcd compaction every CompactionInterval.
func KubetestOptions() kubetest.Options {
	return kubetest.Options{
		AuditPolicy: AuditPolicy,
		AuditLog:    true,
		Flags:       map[string]string{"etcd-compaction-interval": CompactionInterval.String()},
	}
}

// Result is one run of the script.
type Result struct {
	// Requests is every request the workload sent, in the order sent.
	Requests []Request
	// Since and Until bound the run: every request started in [Since, Until)
	// and every audit event of the run has a stageTimestamp inside it.
	Since, Until time.Time
	// Truth is the report for [Since, Until) with the default loop options.
	// Retry loops' First and Last are the client's start times of their
	// first and last conflict; TruthAt puts the apiserver's times in.
	Truth report.Report
	// Loops holds the Audit-Ids of each retry loop's first and last
	// conflict, index for index with Truth.RetryLoops.
	Loops []LoopBounds
	// AuditLogPath is the apiserver's audit log (kubetest.Env.AuditLogPath).
	AuditLogPath string
}

// Run prepares the driver account and namespaces with env's admin client
// (not audited), runs the script, and computes the truth. It returns an
// error when any step got an answer other than the one the script expects.
// Run once per control plane: the script's namespaces must not exist yet.
func Run(ctx context.Context, env *kubetest.Env) (*Result, error) {
	if env.AuditLogPath == "" {
		return nil, errors.New("workload: the control plane has no audit log; start it with KubetestOptions")
	}
	admin, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		return nil, fmt.Errorf("admin client: %w", err)
	}
	driver, err := driverConfig(ctx, admin, env.Config)
	if err != nil {
		return nil, err
	}
	for _, ns := range namespaces {
		if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			return nil, fmt.Errorf("create namespace %s: %w", ns, err)
		}
	}
	rec := &recorder{now: time.Now}
	s, err := newScript(admin, driver, rec)
	if err != nil {
		return nil, err
	}
	since := time.Now().UTC().Truncate(time.Microsecond)
	if err := s.run(ctx); err != nil {
		return nil, err
	}
	// The apiserver writes an event's last stage just after the client has the
	// response; five seconds of slack keep it inside the window.
	until := time.Now().UTC().Add(5 * time.Second).Truncate(time.Microsecond)
	res := &Result{Requests: rec.requests(), Since: since, Until: until, AuditLogPath: env.AuditLogPath}
	for i, r := range res.Requests {
		if r.AuditID == "" {
			return nil, fmt.Errorf("request %d (%s %s %s/%s) has no Audit-Id header", i, r.Verb, r.Resource, r.Namespace, r.Name)
		}
	}
	res.Truth, res.Loops = Truth(res.Requests, since, until, LoopOptions{})
	return res, nil
}

// driverConfig creates the driver service account, binds it to
// cluster-admin (which includes impersonation) and returns a config that
// authenticates with a token for it.
func driverConfig(ctx context.Context, admin kubernetes.Interface, base *rest.Config) (*rest.Config, error) {
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: DriverNamespace}}, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("create namespace %s: %w", DriverNamespace, err)
	}
	if _, err := admin.CoreV1().ServiceAccounts(DriverNamespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: DriverName}}, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("create service account %s: %w", DriverUser, err)
	}
	crb := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "stampguard-workload-driver"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "cluster-admin"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: DriverNamespace, Name: DriverName}},
	}
	if _, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("bind %s to cluster-admin: %w", DriverUser, err)
	}
	exp := int64(3600)
	tr, err := admin.CoreV1().ServiceAccounts(DriverNamespace).CreateToken(ctx, DriverName,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &exp}}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("token for %s: %w", DriverUser, err)
	}
	cfg := rest.AnonymousClientConfig(base)
	cfg.BearerToken = tr.Status.Token
	cfg.QPS, cfg.Burst = 1000, 2000
	// JSON both ways, so that the recorder can read bodies.
	cfg.ContentType, cfg.AcceptContentTypes = "application/json", "application/json"
	return cfg, nil
}
