// Package suggest drafts ConcurrencyPolicies from what the audit history
// shows (`auditsink suggest`): a field owner where one writer makes
// nearly all changes of a field, an immutable field where a field never
// changed, a stamp requirement where stampless updates erased another
// writer's change, and delete preconditions where names are deleted and
// created again by another writer. Each draft is in Audit mode, carries
// its evidence, and is replayed over the same audit logs with `webhook
// replay`'s engine (policy/replay) before anyone enforces it.
//
// The observations come from analytics/report.Observe: the very field
// history and statements the report's lost updates, fights and field
// writers read, from audit log files (analytics/filereport) or from a
// ClickHouse server. Build is a pure function of them and the options, so
// the same history gives the same drafts, byte for byte.
package suggest

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/stampguard/stampguard/analytics/report"
	"github.com/stampguard/stampguard/policy"
	"github.com/stampguard/stampguard/policy/api/v1alpha1"
)

// The defaults of Options (and of `auditsink suggest`'s flags).
const (
	// DefaultOwnerShare is the least share of a field's changes (in its
	// kind and namespace) its owner must have made.
	DefaultOwnerShare = 0.9
	// DefaultMinChanges is the fewest changes an owner must have made.
	DefaultMinChanges = 3
	// DefaultMinWrites is the fewest later writes of objects that kept a
	// field unchanged for it to be drafted immutable.
	DefaultMinWrites = 3
	// DefaultMinLostUpdates is the fewest lost updates by stampless
	// updates that draft a stamp requirement.
	DefaultMinLostUpdates = 1
	// DefaultMinReuses is the fewest names deleted and created again by
	// another writer that draft delete preconditions.
	DefaultMinReuses = 1
	// DefaultNamePrefix starts every draft's name.
	DefaultNamePrefix = "suggested-"
)

// DefaultImmutablePaths are the field paths (and what lies below them)
// that may be drafted immutable: the labels, which identify and select
// objects. Any field that never changed is a candidate in principle; most
// of a spec never changes in a day without being meant to stay so.
var DefaultImmutablePaths = []string{"metadata.labels"}

// DefaultExcludeResources are never drafted: leader-election leases and
// events change hands by design.
var DefaultExcludeResources = []string{"leases.coordination.k8s.io", "events", "events.events.k8s.io"}

// SystemNamespaces are never drafted, besides the webhook's own namespace
// (Options.ExcludeNamespaces): policy.DefaultProtectedNamespaces, which
// the webhook never guards, and kube-public.
var SystemNamespaces = append(slices.Clone(policy.DefaultProtectedNamespaces), "kube-public")

// Options are the thresholds and exclusions of Build.
type Options struct {
	OwnerShare     float64
	MinChanges     uint64
	MinWrites      uint64
	MinLostUpdates uint64
	MinReuses      uint64
	// ImmutablePaths are field paths; a field at or below one may be
	// drafted immutable.
	ImmutablePaths []string
	// ExcludeNamespaces are left out besides SystemNamespaces.
	ExcludeNamespaces []string
	// ExcludeResources are resource or resource.group names left out.
	ExcludeResources []string
	NamePrefix       string
}

// DefaultOptions are the defaults, as the flags have them.
func DefaultOptions() Options {
	return Options{OwnerShare: DefaultOwnerShare, MinChanges: DefaultMinChanges, MinWrites: DefaultMinWrites,
		MinLostUpdates: DefaultMinLostUpdates, MinReuses: DefaultMinReuses,
		ImmutablePaths: slices.Clone(DefaultImmutablePaths), ExcludeResources: slices.Clone(DefaultExcludeResources),
		NamePrefix: DefaultNamePrefix}
}

// Validate names the first option out of range.
func (o Options) Validate() error {
	switch {
	case o.OwnerShare <= 0.5 || o.OwnerShare > 1:
		return fmt.Errorf("owner share %v: want more than 0.5 (a majority) and at most 1", o.OwnerShare)
	case o.MinChanges < 1:
		return fmt.Errorf("min changes %d: want 1 or more", o.MinChanges)
	case o.MinLostUpdates < 1:
		return fmt.Errorf("min lost updates %d: want 1 or more", o.MinLostUpdates)
	case o.MinReuses < 1:
		return fmt.Errorf("min reuses %d: want 1 or more", o.MinReuses)
	}
	for _, p := range o.ImmutablePaths {
		if _, err := policy.ParseFieldPath(p); err != nil {
			return fmt.Errorf("immutable path: %w", err)
		}
	}
	return nil
}

// Kind is a resource in one namespace: what one draft matches.
type Kind struct{ APIGroup, Resource, Namespace string }

// ResourceName is resource or resource.group.
func (k Kind) ResourceName() string {
	if k.APIGroup == "" {
		return k.Resource
	}
	return k.Resource + "." + k.APIGroup
}

func (k Kind) compare(o Kind) int {
	return cmp.Or(cmp.Compare(k.Namespace, o.Namespace), cmp.Compare(k.APIGroup, o.APIGroup), cmp.Compare(k.Resource, o.Resource))
}

// Draft is one ConcurrencyPolicy draft, for one kind in one namespace,
// with the evidence of each rule.
type Draft struct {
	Name string
	Kind Kind
	// Stamp, when set, drafts requireResourceVersion.
	Stamp *StampRule
	// Delete, when set, drafts requireDeletePreconditions: uid.
	Delete *DeleteRule
	// Owners and Immutable are the field rules, by path.
	Owners    []OwnerRule
	Immutable []ImmutableRule
}

// WriterCount is a writer and how many of something it did.
type WriterCount struct {
	Writer string `json:"writer"`
	Count  uint64 `json:"count"`
}

// Span is the first and last time of the evidence.
type Span struct{ First, Last string }

// StampRule is the evidence for requireResourceVersion: the lost updates
// stampless updates made.
type StampRule struct {
	Lost uint64
	// Writers made the stampless updates; Overwritten lost their changes.
	Writers, Overwritten []WriterCount
	// Example is the first lost update.
	Example report.LostUpdate
	Span
	Replay Replayed
}

// DeleteRule is the evidence for requireDeletePreconditions.
type DeleteRule struct {
	report.NameReuse
	Replay Replayed
}

// OwnerRule is a field owner draft.
type OwnerRule struct {
	Path string
	// Owner is the writer who made Changes of Total changes.
	Owner   string
	Changes uint64
	Total   uint64
	Objects uint64
	// Others are the other writers' changes.
	Others []WriterCount
	// Lost counts the lost updates of the field by other writers: what
	// the rule would have prevented.
	Lost uint64
	Span
	Replay Replayed
}

// ImmutableRule is an immutable field draft.
type ImmutableRule struct {
	Path string
	Mode v1alpha1.ImmutableMode
	report.FieldSeen
	Replay Replayed
}

// Replayed is what the draft's rule would have done over the history,
// from `webhook replay`'s engine: the writes it would have refused under
// Deny (Audit records them), by writer, and the writes the log cannot
// decide, by reason.
type Replayed struct {
	Done        bool
	Refused     uint64
	Writers     []WriterCount
	Undecidable uint64
	Reasons     []WriterCount // Writer holds the reason
}

// Build drafts the policies the observations support, sorted by
// namespace, group and resource.
func Build(obs *report.Observations, o Options) ([]Draft, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	b := builder{o: o, drafts: map[Kind]*Draft{}}
	b.owners(obs)
	b.immutable(obs)
	b.stamps(obs)
	b.deletes(obs)
	var out []Draft
	for _, d := range b.drafts {
		out = append(out, *d)
	}
	slices.SortFunc(out, func(a, b Draft) int { return a.Kind.compare(b.Kind) })
	return out, nil
}

type builder struct {
	o      Options
	drafts map[Kind]*Draft
}

// excluded says whether a kind is never drafted.
func (b *builder) excluded(k Kind) bool {
	return k.Namespace == "" || slices.Contains(SystemNamespaces, k.Namespace) || slices.Contains(b.o.ExcludeNamespaces, k.Namespace) ||
		slices.Contains(b.o.ExcludeResources, k.Resource) || slices.Contains(b.o.ExcludeResources, k.ResourceName())
}

func (b *builder) draft(k Kind) *Draft {
	d := b.drafts[k]
	if d == nil {
		d = &Draft{Kind: k, Name: DraftName(b.o.NamePrefix, k)}
		b.drafts[k] = d
	}
	return d
}

// DraftName is a draft's name: prefix, namespace, resource.group (a DNS
// subdomain, as ConcurrencyPolicy names are).
func DraftName(prefix string, k Kind) string {
	return strings.ToLower(prefix + k.Namespace + "-" + k.ResourceName())
}

type fieldKey struct {
	Kind
	field string
}

// owners drafts a field owner where one writer made at least OwnerShare
// of a field's changes in its kind and namespace, and MinChanges.
func (b *builder) owners(obs *report.Observations) {
	byField := map[fieldKey][]report.FieldWriter{}
	for _, w := range obs.Writers {
		k := fieldKey{Kind{w.APIGroup, w.Resource, w.Namespace}, w.Field}
		byField[k] = append(byField[k], w)
	}
	lost := map[fieldKey][]report.LostUpdate{}
	for _, l := range obs.LostUpdates {
		k := fieldKey{Kind{l.APIGroup, l.Resource, l.Namespace}, l.Field}
		lost[k] = append(lost[k], l)
	}
	for k, ws := range byField {
		if b.excluded(k.Kind) || strings.HasPrefix(k.field, "status.") {
			continue
		}
		slices.SortFunc(ws, func(a, b report.FieldWriter) int {
			return cmp.Or(cmp.Compare(b.Changes, a.Changes), cmp.Compare(a.Writer, b.Writer))
		})
		var total uint64
		for _, w := range ws {
			total += w.Changes
		}
		top := ws[0]
		if top.Changes < b.o.MinChanges || float64(top.Changes) < b.o.OwnerShare*float64(total) {
			continue
		}
		r := OwnerRule{Path: k.field, Owner: top.Writer, Changes: top.Changes, Total: total, Objects: top.Objects,
			Span: Span{top.First, top.Last}}
		for _, w := range ws[1:] {
			r.Others = append(r.Others, WriterCount{w.Writer, w.Changes})
			r.First, r.Last = minText(r.First, w.First), max(r.Last, w.Last)
		}
		for _, l := range lost[k] {
			if l.Writer != top.Writer {
				r.Lost++
			}
		}
		d := b.draft(k.Kind)
		d.Owners = append(d.Owners, r)
	}
	for _, d := range b.drafts {
		slices.SortFunc(d.Owners, func(a, b OwnerRule) int { return cmp.Compare(a.Path, b.Path) })
	}
}

// immutable drafts an immutable field where a field under ImmutablePaths
// never changed in its kind and namespace while its objects were written
// MinWrites times after it was first seen: Always when every object the
// history shows whole has it, OnceSet (it may still be set where it is
// missing) when some lack it.
func (b *builder) immutable(obs *report.Observations) {
	changed := map[fieldKey]bool{}
	for _, w := range obs.Writers {
		changed[fieldKey{Kind{w.APIGroup, w.Resource, w.Namespace}, w.Field}] = true
	}
	var prefixes []policy.FieldPath
	for _, p := range b.o.ImmutablePaths {
		fp, _ := policy.ParseFieldPath(p) // Validate parsed it
		prefixes = append(prefixes, fp)
	}
	for _, f := range obs.Fields {
		k := fieldKey{Kind{f.APIGroup, f.Resource, f.Namespace}, f.Field}
		if b.excluded(k.Kind) || changed[k] || f.Versions < f.Objects+b.o.MinWrites || !under(f.Field, prefixes) {
			continue
		}
		mode := v1alpha1.ImmutableAlways
		if f.Objects < f.KindObjects {
			mode = v1alpha1.ImmutableOnceSet
		}
		d := b.draft(k.Kind)
		d.Immutable = append(d.Immutable, ImmutableRule{Path: f.Field, Mode: mode, FieldSeen: f})
	}
	for _, d := range b.drafts {
		slices.SortFunc(d.Immutable, func(a, b ImmutableRule) int { return cmp.Compare(a.Path, b.Path) })
	}
}

// under says whether path is at or below one of prefixes.
func under(path string, prefixes []policy.FieldPath) bool {
	fp, err := policy.ParseFieldPath(path)
	if err != nil {
		return false
	}
	for _, p := range prefixes {
		if fp.HasPrefix(p) {
			return true
		}
	}
	return false
}

// stamps drafts requireResourceVersion where stampless updates lost
// other writers' changes.
func (b *builder) stamps(obs *report.Observations) {
	byKind := map[Kind][]report.LostUpdate{}
	for _, l := range obs.LostUpdates {
		if l.Cause != "stampless" {
			continue
		}
		k := Kind{l.APIGroup, l.Resource, l.Namespace}
		byKind[k] = append(byKind[k], l)
	}
	for k, ls := range byKind {
		if b.excluded(k) || uint64(len(ls)) < b.o.MinLostUpdates {
			continue
		}
		slices.SortFunc(ls, func(a, b report.LostUpdate) int {
			return cmp.Or(cmp.Compare(a.Time, b.Time), cmp.Compare(a.AuditID, b.AuditID), cmp.Compare(a.Field, b.Field))
		})
		r := &StampRule{Lost: uint64(len(ls)), Example: ls[0], Span: Span{ls[0].Time, ls[len(ls)-1].Time}}
		writers, overwritten := map[string]uint64{}, map[string]uint64{}
		for _, l := range ls {
			writers[l.Writer]++
			overwritten[l.OverwrittenWriter]++
		}
		r.Writers, r.Overwritten = counts(writers), counts(overwritten)
		b.draft(k).Stamp = r
	}
}

// deletes drafts delete preconditions where names were deleted and
// created again by another writer.
func (b *builder) deletes(obs *report.Observations) {
	for _, n := range obs.NameReuses {
		k := Kind{n.APIGroup, n.Resource, n.Namespace}
		if b.excluded(k) || n.Reuses < b.o.MinReuses {
			continue
		}
		b.draft(k).Delete = &DeleteRule{NameReuse: n}
	}
}

// counts sorts a tally, the most first.
func counts(m map[string]uint64) []WriterCount {
	out := make([]WriterCount, 0, len(m))
	for w, n := range m {
		out = append(out, WriterCount{w, n})
	}
	slices.SortFunc(out, func(a, b WriterCount) int {
		return cmp.Or(cmp.Compare(b.Count, a.Count), cmp.Compare(a.Writer, b.Writer))
	})
	return out
}

func minText(a, b string) string {
	if a == "" || (b != "" && b < a) {
		return b
	}
	return a
}

// Writers is the policy's writers for a writer as the history names it:
// a service account by namespace/name, anyone else as a user.
func Writers(writer string) v1alpha1.Writers {
	if rest, ok := strings.CutPrefix(writer, "system:serviceaccount:"); ok {
		if ns, name, ok := strings.Cut(rest, ":"); ok && ns != "" && name != "" {
			return v1alpha1.Writers{ServiceAccounts: []string{ns + "/" + name}}
		}
	}
	return v1alpha1.Writers{Users: []string{writer}}
}

// Policy is the draft as a ConcurrencyPolicy, in Audit mode.
func (d *Draft) Policy() *v1alpha1.ConcurrencyPolicy {
	p := &v1alpha1.ConcurrencyPolicy{}
	p.APIVersion, p.Kind = v1alpha1.GroupVersion.String(), "ConcurrencyPolicy"
	p.Name = d.Name
	p.Spec.Action = v1alpha1.ActionAudit
	p.Spec.Match = v1alpha1.Match{Resources: []v1alpha1.ResourceMatch{{Group: d.Kind.APIGroup, Resource: d.Kind.Resource}}, Namespaces: []string{d.Kind.Namespace}}
	p.Spec.RequireResourceVersion = d.Stamp != nil
	if d.Delete != nil {
		p.Spec.RequireDeletePreconditions = v1alpha1.DeletePreconditionUID
	}
	for _, o := range d.Owners {
		p.Spec.FieldOwners = append(p.Spec.FieldOwners, v1alpha1.FieldOwner{Path: o.Path, Writers: Writers(o.Owner)})
	}
	for _, i := range d.Immutable {
		p.Spec.ImmutableFields = append(p.Spec.ImmutableFields, v1alpha1.ImmutableField{Path: i.Path, Mode: i.Mode})
	}
	return p
}
