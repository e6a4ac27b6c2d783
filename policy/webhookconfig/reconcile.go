package webhookconfig

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/stampguard/stampguard/policy"
	"github.com/stampguard/stampguard/policy/api/v1alpha1"
)

// configResync repairs configurations that someone else edited.
const configResync = 30 * time.Second

// SyncMetrics are the configuration sync's series.
type SyncMetrics struct {
	syncs *prometheus.CounterVec
}

// NewSyncMetrics registers the sync's series with reg. A nil reg keeps
// them unregistered (tests).
func NewSyncMetrics(reg prometheus.Registerer) *SyncMetrics {
	m := &SyncMetrics{
		syncs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stampguard_configuration_syncs_total",
			Help: "Syncs of a webhook configuration with the policies, by kind and result (updated, unchanged, conflict, error).",
		}, []string{"kind", "result"}),
	}
	if reg != nil {
		reg.MustRegister(m.syncs)
	}
	return m
}

// Syncer keeps the rules, namespaceSelector and matchConditions of the
// two webhooks in the configuration objects in step with the policies. It
// touches nothing else in those objects.
//
// Every replica runs one, so it is an optimistic read-modify-write, the
// very discipline stampguard asks of writers: read the configuration, then
// list the policies (a quorum read, not the cache), compute the desired
// fields deterministically, skip the update when nothing differs, and
// update with the resourceVersion read first. An update that succeeds was
// computed from a policy list at least as new as the one behind any
// earlier write, so a replica with a stale view can never put an older
// policy set back; a conflict is read again and retried.
type Syncer struct {
	reader  client.Reader // uncached
	writer  client.Writer
	opts    ConfigOptions
	metrics *SyncMetrics
	log     *slog.Logger
	kick    chan struct{}
	mu      sync.Mutex
	coarse  bool // the last compiled condition fell back (logged once)
}

// NewSyncer keeps the configurations of opts (opts.Name) in step, reading
// with reader (uncached: a quorum read) and writing with writer.
func NewSyncer(reader client.Reader, writer client.Writer, opts ConfigOptions, m *SyncMetrics, log *slog.Logger) *Syncer {
	opts.setDefaults()
	return &Syncer{reader: reader, writer: writer, opts: opts, metrics: m, log: log, kick: make(chan struct{}, 1)}
}

// Kick asks for a sync soon; it never blocks.
func (c *Syncer) Kick() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// Start syncs on every kick and every configResync, retrying failures with
// a growing delay, until ctx ends.
func (c *Syncer) Start(ctx context.Context) error {
	resync := time.NewTicker(configResync)
	defer resync.Stop()
	var retryC <-chan time.Time
	delay := 200 * time.Millisecond
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-c.kick:
		case <-resync.C:
		case <-retryC:
		}
		if err := c.Sync(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			c.log.Warn("cannot update the webhook configurations", "name", c.opts.Name, "retryIn", delay.String(), "err", err)
			retryC = time.After(delay)
			delay = min(2*delay, 10*time.Second)
			continue
		}
		retryC, delay = nil, 200*time.Millisecond
	}
}

// NeedLeaderElection is false: every replica keeps the objects in step; the
// updates are idempotent.
func (c *Syncer) NeedLeaderElection() bool { return false }

// Sync brings both configuration objects in step with the policies.
func (c *Syncer) Sync(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	err := c.syncOne(ctx, func() client.Object { return &admissionregistrationv1.MutatingWebhookConfiguration{} }, func(obj client.Object) (owned, bool) {
		cfg := obj.(*admissionregistrationv1.MutatingWebhookConfiguration)
		i := slices.IndexFunc(cfg.Webhooks, func(w admissionregistrationv1.MutatingWebhook) bool { return w.Name == StampWebhookName })
		if i < 0 {
			return owned{}, false
		}
		w := &cfg.Webhooks[i]
		return owned{&w.Rules, &w.NamespaceSelector, &w.MatchConditions}, true
	}, StampWebhookName)
	if err != nil {
		return err
	}
	return c.syncOne(ctx, func() client.Object { return &admissionregistrationv1.ValidatingWebhookConfiguration{} }, func(obj client.Object) (owned, bool) {
		cfg := obj.(*admissionregistrationv1.ValidatingWebhookConfiguration)
		i := slices.IndexFunc(cfg.Webhooks, func(w admissionregistrationv1.ValidatingWebhook) bool { return w.Name == FieldsWebhookName })
		if i < 0 {
			return owned{}, false
		}
		w := &cfg.Webhooks[i]
		return owned{&w.Rules, &w.NamespaceSelector, &w.MatchConditions}, true
	}, FieldsWebhookName)
}

// desired compiles the policies as the apiserver has them now. Invalid
// policies are left out, as the webhook leaves them out.
func (c *Syncer) desired(ctx context.Context) (*admissionregistrationv1.MutatingWebhookConfiguration, *admissionregistrationv1.ValidatingWebhookConfiguration, error) {
	var list v1alpha1.ConcurrencyPolicyList
	if err := c.reader.List(ctx, &list); err != nil {
		return nil, nil, fmt.Errorf("list ConcurrencyPolicies: %w", err)
	}
	var compiled []*policy.Policy
	for i := range list.Items {
		if p, err := policy.Compile(&list.Items[i]); err == nil {
			compiled = append(compiled, p)
		}
	}
	o := c.opts
	o.Policies = policy.NewSet(compiled...)
	if pf := o.prefilter(); pf.Stamp.Exact && pf.Fields.Exact {
		c.coarse = false
	} else if !c.coarse {
		c.coarse = true
		c.log.Warn("the policies compile to a match condition past the apiserver's size bound; the webhook is called for every write a policy applies to",
			"policies", o.Policies.Len(), "maxBytes", policy.DefaultMaxConditionBytes)
	}
	mut, val := Configurations(o)
	return mut, val, nil
}

// owned points at the fields of one webhook that the sync owns.
type owned struct {
	rules      *[]admissionregistrationv1.RuleWithOperations
	selector   **metav1.LabelSelector
	conditions *[]admissionregistrationv1.MatchCondition
}

func (c *Syncer) syncOne(ctx context.Context, newObj func() client.Object, find func(client.Object) (owned, bool), webhook string) error {
	name := c.opts.Name
	kind := fmt.Sprintf("%T", newObj())[len("*v1."):]
	result := "error"
	defer func() { c.metrics.syncs.WithLabelValues(kind, result).Inc() }()
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		// The configuration first, the policies second: see Syncer.
		obj := newObj()
		if err := c.reader.Get(ctx, client.ObjectKey{Name: name}, obj); err != nil {
			return fmt.Errorf("get %s %q: %w", kind, name, err)
		}
		cur, ok := find(obj)
		if !ok {
			return fmt.Errorf("%s %q has no webhook %q", kind, name, webhook)
		}
		mut, val, err := c.desired(ctx)
		if err != nil {
			return err
		}
		var want owned
		if _, isMutating := obj.(*admissionregistrationv1.MutatingWebhookConfiguration); isMutating {
			want, _ = find(mut)
		} else {
			want, _ = find(val)
		}
		// The apiserver defaults an unset namespaceSelector to {}.
		wantSel, curSel := *want.selector, *cur.selector
		if wantSel == nil {
			wantSel = &metav1.LabelSelector{}
		}
		if curSel == nil {
			curSel = &metav1.LabelSelector{}
		}
		if equality.Semantic.DeepEqual(*cur.rules, *want.rules) && equality.Semantic.DeepEqual(curSel, wantSel) &&
			equality.Semantic.DeepEqual(*cur.conditions, *want.conditions) {
			result = "unchanged"
			return nil
		}
		*cur.rules, *cur.selector, *cur.conditions = *want.rules, wantSel, *want.conditions
		// Update sends the resourceVersion just read: a concurrent writer
		// makes it fail with a conflict, and RetryOnConflict reads again.
		if err := c.writer.Update(ctx, obj); err != nil {
			if apierrors.IsConflict(err) {
				c.metrics.syncs.WithLabelValues(kind, "conflict").Inc()
			}
			return err
		}
		result = "updated"
		c.log.Info("webhook configuration updated", "kind", kind, "name", name, "webhook", webhook,
			"resourceVersion", obj.GetResourceVersion())
		return nil
	})
}
