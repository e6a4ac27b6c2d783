package admission

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// configResync repairs configurations that someone else edited.
const configResync = 30 * time.Second

// configSync keeps the rules, namespaceSelector and matchConditions of the
// two webhooks in the configuration objects in step with the policy set.
// It touches nothing else in those objects. Every replica runs one: the
// desired state is computed deterministically from the set, an update is
// skipped when nothing differs, and each update carries the
// resourceVersion it read, so replicas never overwrite each other blindly
// (a conflict is read again and retried).
type configSync struct {
	reader client.Reader // uncached: get on two named objects is all the RBAC it needs
	writer client.Writer
	opts   ConfigOptions
	source PolicySource
	log    *slog.Logger
	kick   chan struct{}
	mu     sync.Mutex
}

func newConfigSync(reader client.Reader, writer client.Writer, opts ConfigOptions, source PolicySource, log *slog.Logger) *configSync {
	opts.setDefaults()
	return &configSync{reader: reader, writer: writer, opts: opts, source: source, log: log, kick: make(chan struct{}, 1)}
}

// Kick asks for a sync soon; it never blocks.
func (c *configSync) Kick() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// Start syncs on every kick and every configResync, retrying failures with
// a growing delay, until ctx ends.
func (c *configSync) Start(ctx context.Context) error {
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
func (c *configSync) NeedLeaderElection() bool { return false }

// Sync brings both configuration objects in step with the current set.
// Before the first set is built it does nothing.
func (c *configSync) Sync(ctx context.Context) error {
	set := c.source.Policies()
	if set == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	o := c.opts
	o.Policies = set
	mut, val := Configurations(o)
	mw, vw := mut.Webhooks[0], val.Webhooks[0]
	err := c.syncOne(ctx, func() client.Object { return &admissionregistrationv1.MutatingWebhookConfiguration{} }, o.Name, func(obj client.Object) (owned, bool) {
		cfg := obj.(*admissionregistrationv1.MutatingWebhookConfiguration)
		i := slices.IndexFunc(cfg.Webhooks, func(w admissionregistrationv1.MutatingWebhook) bool { return w.Name == StampWebhookName })
		if i < 0 {
			return owned{}, false
		}
		w := &cfg.Webhooks[i]
		return owned{&w.Rules, &w.NamespaceSelector, &w.MatchConditions}, true
	}, owned{&mw.Rules, &mw.NamespaceSelector, &mw.MatchConditions}, StampWebhookName)
	if err != nil {
		return err
	}
	return c.syncOne(ctx, func() client.Object { return &admissionregistrationv1.ValidatingWebhookConfiguration{} }, o.Name, func(obj client.Object) (owned, bool) {
		cfg := obj.(*admissionregistrationv1.ValidatingWebhookConfiguration)
		i := slices.IndexFunc(cfg.Webhooks, func(w admissionregistrationv1.ValidatingWebhook) bool { return w.Name == FieldsWebhookName })
		if i < 0 {
			return owned{}, false
		}
		w := &cfg.Webhooks[i]
		return owned{&w.Rules, &w.NamespaceSelector, &w.MatchConditions}, true
	}, owned{&vw.Rules, &vw.NamespaceSelector, &vw.MatchConditions}, FieldsWebhookName)
}

// owned points at the fields of one webhook that the sync owns.
type owned struct {
	rules      *[]admissionregistrationv1.RuleWithOperations
	selector   **metav1.LabelSelector
	conditions *[]admissionregistrationv1.MatchCondition
}

func (c *configSync) syncOne(ctx context.Context, newObj func() client.Object, name string, find func(client.Object) (owned, bool), want owned, webhook string) error {
	kind := fmt.Sprintf("%T", newObj())[len("*v1."):]
	// The apiserver defaults an unset namespaceSelector to {}.
	wantSel := *want.selector
	if wantSel == nil {
		wantSel = &metav1.LabelSelector{}
	}
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		obj := newObj()
		if err := c.reader.Get(ctx, client.ObjectKey{Name: name}, obj); err != nil {
			return fmt.Errorf("get %s %q: %w", kind, name, err)
		}
		cur, ok := find(obj)
		if !ok {
			return fmt.Errorf("%s %q has no webhook %q", kind, name, webhook)
		}
		curSel := *cur.selector
		if curSel == nil {
			curSel = &metav1.LabelSelector{}
		}
		if equality.Semantic.DeepEqual(*cur.rules, *want.rules) && equality.Semantic.DeepEqual(curSel, wantSel) &&
			equality.Semantic.DeepEqual(*cur.conditions, *want.conditions) {
			return nil
		}
		*cur.rules, *cur.selector, *cur.conditions = *want.rules, wantSel.DeepCopy(), *want.conditions
		// Update sends the resourceVersion just read: a concurrent writer
		// makes it fail with a conflict, and RetryOnConflict reads again.
		if err := c.writer.Update(ctx, obj); err != nil {
			return err
		}
		c.log.Info("webhook configuration updated", "kind", kind, "name", name, "webhook", webhook,
			"resourceVersion", obj.GetResourceVersion())
		return nil
	})
}
