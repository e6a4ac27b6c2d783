package app

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/stampguard/stampguard/internal/cli"
	"github.com/stampguard/stampguard/policy"
	"github.com/stampguard/stampguard/policy/api/v1alpha1"
	"github.com/stampguard/stampguard/policy/replay"
	"github.com/stampguard/stampguard/policy/webhookconfig"
)

// The defaults of `webhook replay`'s flags; --top's is replay.DefaultTop.
const (
	// DefaultReplayFormat is --format's: the table.
	DefaultReplayFormat = "table"
	// DefaultRefusedShown is how many refused writes the table prints.
	DefaultRefusedShown = 20
)

// ReplayFlags are the flags of `webhook replay`. The rule for an option
// with both: an explicit flag beats the environment, the environment
// beats the default ($KUBECONFIG, $POD_NAMESPACE as the webhook's).
type ReplayFlags struct {
	// PolicyFile is --policy-file: the policies to replay.
	PolicyFile string
	// FromCluster is --policies-from-cluster: replay the cluster's
	// ConcurrencyPolicies (and answer namespaceSelector with its namespaces).
	FromCluster bool
	// Kubeconfig is --kubeconfig; empty: $KUBECONFIG, then in-cluster.
	Kubeconfig string
	// Since and Until are --since and --until: RFC3339, or a duration ago.
	Since, Until string
	// Format is --format: table or json.
	Format string
	// Top is --top: writers and objects listed.
	Top int
	// Refused is --refused: refused writes the table prints.
	Refused int
	// Namespace and BreakGlassGroup are the webhook's --namespace and
	// --break-glass-group.
	Namespace, BreakGlassGroup string
}

// Register binds f to fs.
func (f *ReplayFlags) Register(fs *flag.FlagSet) {
	fs.StringVar(&f.PolicyFile, "policy-file", "", "replay the ConcurrencyPolicies of this multi-document YAML `file`")
	fs.BoolVar(&f.FromCluster, "policies-from-cluster", false, "replay the cluster's ConcurrencyPolicies (with --policy-file: both), and answer namespaceSelector with the cluster's namespaces")
	fs.StringVar(&f.Kubeconfig, "kubeconfig", "", "kubeconfig `file` for --policies-from-cluster (default $"+KubeconfigEnv+", then the in-cluster config)")
	fs.StringVar(&f.Since, "since", "", "replay the writes from this `time` on: RFC3339, or a duration ago (2h, 7d); earlier events still rebuild the objects (default the log's start)")
	fs.StringVar(&f.Until, "until", "", "replay the writes before this `time`: RFC3339, or a duration ago (default the log's end)")
	fs.StringVar(&f.Format, "format", DefaultReplayFormat, "output `format`: table or json (docs/replay.md)")
	fs.IntVar(&f.Top, "top", replay.DefaultTop, "list this many `writers` and objects")
	fs.IntVar(&f.Refused, "refused", DefaultRefusedShown, "print this many refused writes with their messages in the table (json lists all)")
	fs.StringVar(&f.Namespace, "namespace", os.Getenv(NamespaceEnv), "the webhook's own `namespace`, never guarded unless a policy names it, as the webhook's --namespace (default $"+NamespaceEnv+")")
	fs.StringVar(&f.BreakGlassGroup, "break-glass-group", webhookconfig.DefaultBreakGlassGroup, "members of this `group` bypass every policy, as the webhook's (\"-\" disables)")
}

// Replay is a resolved `webhook replay` command line.
type Replay struct {
	Options replay.Options
	Paths   []string
	JSON    bool
	Top     int
	Refused int
	// cluster, when set, lists policies and namespaces at Execute.
	cluster *rest.Config
	file    []*policy.Policy
}

// Resolve validates f and the audit log operands; every error is a
// cli.UsageError naming the flag or file at fault. now ends --since's
// durations.
func (f *ReplayFlags) Resolve(paths []string, now time.Time) (*Replay, error) {
	r := &Replay{Paths: paths, Top: f.Top, Refused: f.Refused}
	switch f.Format {
	case "table":
	case "json":
		r.JSON = true
	default:
		return nil, cli.Usagef("--format %q: want table or json", f.Format)
	}
	if f.Top < 1 || f.Refused < 0 {
		return nil, cli.Usagef("--top %d / --refused %d: want at least 1 and 0", f.Top, f.Refused)
	}
	if len(paths) == 0 {
		return nil, cli.Usagef("name at least one audit log file (plain or gzip; rotated files in any order)")
	}
	for _, p := range paths {
		if st, err := os.Stat(p); err != nil {
			return nil, cli.Usagef("audit log: %w", err)
		} else if st.IsDir() {
			return nil, cli.Usagef("audit log %s is a directory: name its files", p)
		}
	}
	if f.PolicyFile == "" && !f.FromCluster {
		return nil, cli.Usagef("give the policies to replay: --policy-file FILE, or --policies-from-cluster")
	}
	if f.Kubeconfig != "" && !f.FromCluster {
		return nil, cli.Usagef("--kubeconfig is for --policies-from-cluster")
	}
	var err error
	if f.PolicyFile != "" {
		if r.file, err = policy.LoadFile(f.PolicyFile); err != nil {
			return nil, cli.Usagef("--policy-file: %w", err)
		}
		if len(r.file) == 0 && !f.FromCluster {
			return nil, cli.Usagef("--policy-file %s holds no policies: nothing to replay", f.PolicyFile)
		}
	}
	if f.FromCluster {
		if r.cluster, err = restConfig(f.Kubeconfig); err != nil {
			return nil, err
		}
	}
	if f.Since != "" {
		if r.Options.Since, err = cli.ParseTime(f.Since, now); err != nil {
			return nil, cli.Usagef("--since: %w", err)
		}
	}
	if f.Until != "" {
		if r.Options.Until, err = cli.ParseTime(f.Until, now); err != nil {
			return nil, cli.Usagef("--until: %w", err)
		}
	}
	if !r.Options.Since.IsZero() && !r.Options.Until.IsZero() && !r.Options.Since.Before(r.Options.Until) {
		return nil, cli.Usagef("--since %s is not before --until %s: the window is empty", f.Since, f.Until)
	}
	if f.BreakGlassGroup == "" {
		return nil, cli.Usagef("--break-glass-group is empty: name a group, or \"-\" for none")
	}
	r.Options.BreakGlassGroup = f.BreakGlassGroup
	if f.Namespace != "" {
		r.Options.ProtectedNamespaces = []string{f.Namespace}
	}
	return r, nil
}

// Execute replays the files and writes the report to w.
func (r *Replay) Execute(ctx context.Context, w io.Writer) error {
	ps := r.file
	if r.cluster != nil {
		cps, ns, err := fromCluster(ctx, r.cluster)
		if err != nil {
			return err
		}
		ps = append(ps, cps...)
		r.Options.Namespaces = ns
	}
	if len(ps) == 0 {
		return fmt.Errorf("the cluster holds no ConcurrencyPolicies: nothing to replay")
	}
	r.Options.Policies = policy.NewSet(ps...)
	rp, err := replay.New(r.Options)
	if err != nil {
		return err
	}
	if err := replay.Files(ctx, rp, r.Paths); err != nil {
		return err
	}
	rep := rp.Report()
	rep.Trim(r.Top)
	if r.JSON {
		return replay.WriteJSON(w, rep)
	}
	return replay.WriteTable(w, rep, r.Refused)
}

// fromCluster lists and compiles the cluster's policies, and its
// namespaces' labels.
func fromCluster(ctx context.Context, cfg *rest.Config) ([]*policy.Policy, map[string]labels.Set, error) {
	scheme := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return nil, nil, err
	}
	if err := corev1.AddToScheme(scheme); err != nil {
		return nil, nil, err
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, nil, fmt.Errorf("cluster client: %w", err)
	}
	var list v1alpha1.ConcurrencyPolicyList
	if err := c.List(ctx, &list); err != nil {
		return nil, nil, fmt.Errorf("list ConcurrencyPolicies: %w", err)
	}
	var ps []*policy.Policy
	var bad []string
	for i := range list.Items {
		p, err := policy.Compile(&list.Items[i])
		if err != nil {
			bad = append(bad, fmt.Sprintf("%s: %v", list.Items[i].Name, err))
			continue
		}
		ps = append(ps, p)
	}
	if len(bad) > 0 {
		// Replaying without them would answer for a set nobody wrote.
		return nil, nil, fmt.Errorf("ConcurrencyPolicies that do not compile (fix or delete them, or replay a --policy-file): %s", strings.Join(bad, "; "))
	}
	var nsList corev1.NamespaceList
	if err := c.List(ctx, &nsList); err != nil {
		return nil, nil, fmt.Errorf("list namespaces: %w", err)
	}
	ns := make(map[string]labels.Set, len(nsList.Items))
	for _, n := range nsList.Items {
		ns[n.Name] = labels.Set(n.Labels)
	}
	return ps, ns, nil
}
