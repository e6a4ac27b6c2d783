package app

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/api/equality"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/stampguard/stampguard/policy"
	"github.com/stampguard/stampguard/policy/admission"
	"github.com/stampguard/stampguard/policy/api/v1alpha1"
	"github.com/stampguard/stampguard/policy/webhookconfig"
)

// policyMetrics count the policies a source holds.
type policyMetrics struct {
	policies *prometheus.GaugeVec
}

// newPolicyMetrics registers the series with reg.
func newPolicyMetrics(reg prometheus.Registerer) *policyMetrics {
	m := &policyMetrics{policies: prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "stampguard_policies",
		Help: "ConcurrencyPolicies known to the webhook, by state (ready or invalid).",
	}, []string{"state"})}
	reg.MustRegister(m.policies)
	return m
}

// set records how many policies are in force and how many were refused.
func (m *policyMetrics) set(ready, invalid int) {
	m.policies.WithLabelValues("ready").Set(float64(ready))
	m.policies.WithLabelValues("invalid").Set(float64(invalid))
}

// ClusterSource keeps the policy set in step with the ConcurrencyPolicy
// objects in the cluster. Every change recompiles the whole (small) set from
// the informer cache and swaps it in atomically, so a request sees either
// the old set or the new one, never a mix.
type ClusterSource struct {
	client  client.Client
	cache   cache.Cache
	metrics *policyMetrics
	log     *slog.Logger
	set     atomic.Pointer[policy.Set]
	// configs, when set, keeps the webhook configurations in step.
	configs *webhookconfig.Syncer
}

var _ admission.PolicySource = (*ClusterSource)(nil)

// Policies returns the set in force, or nil until the cache has synced and
// the first set was built.
func (s *ClusterSource) Policies() *policy.Set { return s.set.Load() }

// Ready reports an error until the first policy set is in force.
func (s *ClusterSource) Ready() error {
	if s.set.Load() == nil {
		return fmt.Errorf("policies not loaded yet")
	}
	return nil
}

// Condition type and reasons on ConcurrencyPolicy status.
const (
	ConditionReady = "Ready"
	ReasonEnforced = "Enforced"
	ReasonInvalid  = "Invalid"
	// ReasonNotRouted: the webhook configurations could not be updated
	// for the policy (with Options.Configurations).
	ReasonNotRouted = "NotRouted"
)

// Reconcile rebuilds the policy set and reports on the named policy.
func (s *ClusterSource) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	target, targetErr, err := s.rebuild(ctx, req.Name)
	if err != nil {
		return ctrl.Result{}, err
	}
	// Ready means routed too: the configurations send the policy's writes
	// to the webhook before its status says it is enforced.
	var routeErr error
	if s.configs != nil {
		if routeErr = s.configs.Sync(ctx); routeErr != nil {
			routeErr = fmt.Errorf("update the webhook configurations: %w", routeErr)
			s.configs.Kick()
		}
	}
	if target == nil {
		return ctrl.Result{}, routeErr // deleted: it is gone from the set already
	}
	if err := s.updateStatus(ctx, target, targetErr, routeErr); err != nil {
		return ctrl.Result{}, err
	}
	return ctrl.Result{}, routeErr
}

// Start builds the first set once the cache has synced, so that a cluster
// without any policy still becomes ready.
func (s *ClusterSource) Start(ctx context.Context) error {
	if !s.cache.WaitForCacheSync(ctx) {
		return fmt.Errorf("policy cache did not sync: %w", context.Cause(ctx))
	}
	if _, _, err := s.rebuild(ctx, ""); err != nil {
		return err
	}
	if s.configs != nil {
		s.configs.Kick()
	}
	<-ctx.Done()
	return nil
}

// rebuild compiles every policy in the cache and swaps the set in. It
// returns the policy called name, if it exists, and its compile error.
func (s *ClusterSource) rebuild(ctx context.Context, name string) (*v1alpha1.ConcurrencyPolicy, error, error) {
	var list v1alpha1.ConcurrencyPolicyList
	if err := s.client.List(ctx, &list); err != nil {
		return nil, nil, fmt.Errorf("list ConcurrencyPolicies: %w", err)
	}
	var compiled []*policy.Policy
	var target *v1alpha1.ConcurrencyPolicy
	var targetErr error
	invalid := 0
	for i := range list.Items {
		p := &list.Items[i]
		c, err := policy.Compile(p)
		if err != nil {
			invalid++
		} else {
			compiled = append(compiled, c)
		}
		if p.Name == name {
			target, targetErr = p, err
		}
	}
	set := policy.NewSet(compiled...)
	old := s.set.Swap(set)
	s.metrics.set(len(compiled), invalid)
	if old == nil || !equalNames(old.Names(), set.Names()) {
		s.log.Info("policy set updated", "policies", set.Names(), "invalid", invalid, "changed", name)
	}
	return target, targetErr, nil
}

func equalNames(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func (s *ClusterSource) updateStatus(ctx context.Context, p *v1alpha1.ConcurrencyPolicy, compileErr, routeErr error) error {
	cond := metav1.Condition{
		Type: ConditionReady, Status: metav1.ConditionTrue, Reason: ReasonEnforced,
		Message: "the policy is compiled and enforced", ObservedGeneration: p.Generation,
	}
	switch {
	case compileErr != nil:
		cond.Status, cond.Reason = metav1.ConditionFalse, ReasonInvalid
		cond.Message = fmt.Sprintf("the policy is not enforced: %v", compileErr)
		s.log.Warn("invalid ConcurrencyPolicy", "policy", p.Name, "err", compileErr)
	case routeErr != nil:
		cond.Status, cond.Reason = metav1.ConditionFalse, ReasonNotRouted
		cond.Message = fmt.Sprintf("the policy is compiled, but the webhook configurations may not send its writes yet: %v", routeErr)
	}
	status := p.Status.DeepCopy()
	status.ObservedGeneration = p.Generation
	apimeta.SetStatusCondition(&status.Conditions, cond)
	if equality.Semantic.DeepEqual(status, &p.Status) {
		return nil
	}
	patched := p.DeepCopy()
	patched.Status = *status
	if err := s.client.Status().Patch(ctx, patched, client.MergeFrom(p)); err != nil {
		return fmt.Errorf("update status of ConcurrencyPolicy %q: %w", p.Name, err)
	}
	return nil
}

// namespaceLabels resolves namespaceSelector from the manager's cache,
// which holds namespace metadata only.
type namespaceLabels struct {
	ctx    context.Context
	reader client.Reader
}

func (n namespaceLabels) Labels(ns string) (labels.Set, bool) {
	var obj metav1.PartialObjectMetadata
	obj.SetGroupVersionKind(namespaceGVK)
	if err := n.reader.Get(n.ctx, types.NamespacedName{Name: ns}, &obj); err != nil {
		return nil, false
	}
	return obj.Labels, true
}

// NeedLeaderElection is false: every replica serves admission and needs the set.
func (s *ClusterSource) NeedLeaderElection() bool { return false }
