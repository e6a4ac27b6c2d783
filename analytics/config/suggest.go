package config

import (
	"flag"
	"io"
	"strings"
	"time"

	"github.com/stampguard/stampguard/analytics/report"
	"github.com/stampguard/stampguard/analytics/suggest"
	"github.com/stampguard/stampguard/internal/cli"
	"github.com/stampguard/stampguard/policy/webhookconfig"
)

// SuggestConfig is what `auditsink suggest` reads: where the history is
// (FILEs, or a ClickHouse server as for report), its window and filters,
// the thresholds and exclusions of the drafts, and the webhook's settings
// the drafts are replayed with.
type SuggestConfig struct {
	report ReportConfig
	// Options are the thresholds (suggest.Default*).
	Options suggest.Options
	// ImmutablePaths, ExcludeNamespaces and ExcludeResources are the
	// comma-separated lists of --immutable-paths, --exclude-namespaces
	// and --exclude-resources.
	ImmutablePaths, ExcludeNamespaces, ExcludeResources string
	// WebhookNamespace and BreakGlassGroup are the webhook's --namespace
	// and --break-glass-group.
	WebhookNamespace, BreakGlassGroup string
}

// Register binds s to the flags of suggest, with the Default* values.
func (s *SuggestConfig) Register(fs *flag.FlagSet) {
	s.report.registerSource(fs)
	d := suggest.DefaultOptions()
	s.Options = d
	fs.Float64Var(&s.Options.OwnerShare, "owner-share", d.OwnerShare, "draft a field owner where one writer made at least this `share` of a field's changes (in its kind and namespace), above 0.5")
	fs.Uint64Var(&s.Options.MinChanges, "min-changes", d.MinChanges, "and the owner made at least this many `changes`")
	fs.Uint64Var(&s.Options.MinWrites, "min-writes", d.MinWrites, "draft an immutable field where it never changed while its objects were written at least this many `times` after it was first seen")
	fs.Uint64Var(&s.Options.MinLostUpdates, "min-lost-updates", d.MinLostUpdates, "draft requireResourceVersion where stampless updates lost at least this many other writers' changes")
	fs.Uint64Var(&s.Options.MinReuses, "min-reuses", d.MinReuses, "draft delete preconditions where at least this many names were deleted and created again by another writer")
	fs.StringVar(&s.ImmutablePaths, "immutable-paths", strings.Join(d.ImmutablePaths, ","), "comma-separated field `paths`; only a field at or below one is drafted immutable")
	fs.StringVar(&s.ExcludeNamespaces, "exclude-namespaces", "", "comma-separated `namespaces` never drafted, besides "+strings.Join(suggest.SystemNamespaces, ", ")+" and --webhook-namespace")
	fs.StringVar(&s.ExcludeResources, "exclude-resources", strings.Join(d.ExcludeResources, ","), "comma-separated `resources` (resource or resource.group) never drafted")
	fs.StringVar(&s.Options.NamePrefix, "name-prefix", d.NamePrefix, "the drafts' names start with this `prefix`")
	fs.StringVar(&s.WebhookNamespace, "webhook-namespace", "", "the webhook's own `namespace` (its --namespace): never drafted, and never guarded in the replay")
	fs.StringVar(&s.BreakGlassGroup, "break-glass-group", webhookconfig.DefaultBreakGlassGroup, "the webhook's break-glass `group`, whose members the replay lets through (\"-\": none)")
}

// Suggest is a validated SuggestConfig: the history's source and window
// (a Report, whose Files is set for FILEs), the thresholds, and the
// replay's settings.
type Suggest struct {
	*Report
	Options suggest.Options
	Replay  suggest.ReplayOptions
}

// Resolve validates s and the files (none: the history on a server); now
// is the end of the window without --until.
func (s *SuggestConfig) Resolve(files []string, now time.Time, w io.Writer) (*Suggest, error) {
	r := s.report
	r.Format, r.Top, r.LoopThreshold, r.FightHandoffs, r.LoopGap, r.History = "table", 1, report.DefaultLoopThreshold, report.DefaultFightHandoffs, report.DefaultLoopGap, true
	o := s.Options
	o.ImmutablePaths, o.ExcludeNamespaces, o.ExcludeResources = SplitList(s.ImmutablePaths), SplitList(s.ExcludeNamespaces), SplitList(s.ExcludeResources)
	if s.WebhookNamespace != "" {
		o.ExcludeNamespaces = append(o.ExcludeNamespaces, s.WebhookNamespace)
	}
	if err := o.Validate(); err != nil {
		return nil, cli.Usage(err)
	}
	rep, err := r.Resolve(files, now, w)
	if err != nil {
		return nil, err
	}
	res := &Suggest{Report: rep, Options: o, Replay: suggest.ReplayOptions{BreakGlassGroup: s.BreakGlassGroup}}
	if s.WebhookNamespace != "" {
		res.Replay.ProtectedNamespaces = []string{s.WebhookNamespace}
	}
	return res, nil
}
