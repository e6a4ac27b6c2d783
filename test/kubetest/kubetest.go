// Package kubetest starts a real kube-apiserver and etcd, built from the Go
// module proxy into bin/ by `make controlplane`, through controller-runtime's
// envtest. Tests get a rest.Config, the webhook serving certificates that
// envtest generated, and the apiserver's audit log.
package kubetest

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/stampguard/stampguard/policy/api/v1alpha1"

	"github.com/stampguard/stampguard/test/testenv"
)

// DefaultAuditPolicy records writes with their request bodies and reads at
// metadata level, and never the bodies of secrets.
const DefaultAuditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
  resources: [{group: "", resources: ["secrets"]}]
- level: Request
  verbs: ["create", "update", "patch", "delete", "deletecollection"]
- level: Metadata
`

// Options shape the control plane.
type Options struct {
	// CRDDirs are installed before Start returns. Defaults to the chart's crds/.
	CRDDirs []string
	// AuditPolicy, when set, turns on auditing with this policy (YAML).
	AuditPolicy string
	// AuditLog writes the log backend's JSON lines to a file in the test's
	// directory (needs AuditPolicy).
	AuditLog bool
	// AuditWebhookURL sends audit batches to this URL (needs AuditPolicy).
	AuditWebhookURL string
	// AuditWebhookCAFile verifies the audit webhook's certificate.
	AuditWebhookCAFile string
	// AuditWebhookToken is sent as a bearer token to the audit webhook.
	AuditWebhookToken string
	// Flags are extra kube-apiserver flags, e.g. audit-webhook-batch-max-wait.
	Flags map[string]string
	// BinDir holds kube-apiserver and etcd. Start defaults it (BinDir()).
	BinDir string
	// Dir receives the audit policy, log and kubeconfigs. Start defaults it
	// to the test's temporary directory.
	Dir string
}

// Env is a running control plane.
type Env struct {
	Config *rest.Config
	Client client.Client
	Scheme *runtime.Scheme
	// AuditLogPath is the audit log file when Options.AuditLog was set.
	AuditLogPath string
	// WebhookHost, WebhookPort, CertDir and CAData serve an admission
	// webhook that this apiserver trusts.
	WebhookHost string
	WebhookPort int
	CertDir     string
	CAData      []byte

	env *envtest.Environment
}

// RepoRoot finds the module root from the test's working directory.
func RepoRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatalf("getwd: %v", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			if _, err := os.Stat(filepath.Join(dir, "policy")); err == nil {
				return dir
			}
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatalf("cannot find the stampguard module root above the working directory")
		}
		dir = parent
	}
}

// BinDir is where kube-apiserver and etcd live: KUBEBUILDER_ASSETS, else bin/.
func BinDir(t testing.TB) string {
	t.Helper()
	dir := os.Getenv("KUBEBUILDER_ASSETS")
	if dir == "" {
		dir = filepath.Join(RepoRoot(t), "bin")
	}
	for _, b := range []string{"kube-apiserver", "etcd"} {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			t.Fatalf("%s not found in %s: run `make controlplane` (or `make test`), which builds it from the Go module proxy", b, dir)
		}
	}
	return dir
}

// Start runs a control plane for the rest of the test and stops it at cleanup.
func Start(t testing.TB, o Options) *Env {
	t.Helper()
	testenv.SkipIfShort(t, "starts a real kube-apiserver")
	root := RepoRoot(t)
	if o.BinDir == "" {
		o.BinDir = BinDir(t)
	}
	if o.CRDDirs == nil {
		o.CRDDirs = []string{filepath.Join(root, "charts", "stampguard", "crds")}
	}
	if o.Dir == "" {
		o.Dir = t.TempDir()
	}
	e, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := e.Stop(); err != nil {
			t.Errorf("stop control plane: %v", err)
		}
	})
	return e
}

// New starts a control plane outside a test (the demo). Call Stop when done.
func New(o Options) (*Env, error) {
	if o.BinDir == "" || len(o.CRDDirs) == 0 || o.Dir == "" {
		return nil, fmt.Errorf("kubetest: BinDir, CRDDirs and Dir are required")
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, fmt.Errorf("scheme: %w", err)
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return nil, fmt.Errorf("scheme: %w", err)
	}
	env := &envtest.Environment{
		Scheme:                   scheme,
		BinaryAssetsDirectory:    o.BinDir,
		CRDDirectoryPaths:        o.CRDDirs,
		ErrorIfCRDPathMissing:    true,
		ControlPlaneStartTimeout: 2 * time.Minute,
		ControlPlaneStopTimeout:  time.Minute,
	}
	dir := o.Dir
	e := &Env{Scheme: scheme, env: env}
	args := env.ControlPlane.GetAPIServer().Configure()
	if o.AuditPolicy != "" {
		pol := filepath.Join(dir, "audit-policy.yaml")
		if err := os.WriteFile(pol, []byte(o.AuditPolicy), 0o600); err != nil {
			return nil, err
		}
		args.Set("audit-policy-file", pol)
		if o.AuditLog {
			e.AuditLogPath = filepath.Join(dir, "audit.log")
			args.Set("audit-log-path", e.AuditLogPath)
			args.Set("audit-log-format", "json")
			args.Set("audit-log-mode", "blocking")
		}
		if o.AuditWebhookURL != "" {
			kc := filepath.Join(dir, "audit-webhook.kubeconfig")
			if err := os.WriteFile(kc, []byte(webhookKubeconfig(o.AuditWebhookURL, o.AuditWebhookCAFile, o.AuditWebhookToken)), 0o600); err != nil {
				return nil, err
			}
			args.Set("audit-webhook-config-file", kc)
			args.Set("audit-webhook-mode", "batch")
			args.Set("audit-webhook-batch-max-wait", "1s")
		}
	}
	for k, v := range o.Flags {
		args.Set(k, v)
	}
	cfg, err := env.Start()
	if err != nil {
		return nil, fmt.Errorf("start control plane: %w", err)
	}
	cfg.QPS, cfg.Burst = 1000, 2000
	e.Config = cfg
	e.Client, err = client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		_ = env.Stop()
		return nil, fmt.Errorf("client: %w", err)
	}
	w := env.WebhookInstallOptions
	e.WebhookHost, e.WebhookPort, e.CertDir, e.CAData = w.LocalServingHost, w.LocalServingPort, w.LocalServingCertDir, w.LocalServingCAData
	return e, nil
}

// Stop ends the control plane.
func (e *Env) Stop() error { return e.env.Stop() }

// WebhookURL is the base URL at which the apiserver reaches a webhook that
// serves with the certificates in CertDir.
func (e *Env) WebhookURL() string {
	return "https://" + e.WebhookHost + ":" + strconv.Itoa(e.WebhookPort)
}

// As returns a config that impersonates user with groups. system:masters is
// added so that RBAC never gets in the way of what the test is about.
func (e *Env) As(user string, groups ...string) *rest.Config {
	cfg := rest.CopyConfig(e.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: append([]string{"system:masters"}, groups...)}
	return cfg
}

// ClientAs is As as a controller-runtime client.
func (e *Env) ClientAs(t testing.TB, user string, groups ...string) client.Client {
	t.Helper()
	c, err := client.New(e.As(user, groups...), client.Options{Scheme: e.Scheme})
	if err != nil {
		t.Fatalf("client as %s: %v", user, err)
	}
	return c
}

func webhookKubeconfig(url, caFile, token string) string {
	cluster := "    server: " + url + "\n"
	if caFile != "" {
		cluster += "    certificate-authority: " + caFile + "\n"
	}
	user := "  user: {}\n"
	if token != "" {
		user = "  user:\n    token: " + token + "\n"
	}
	return "apiVersion: v1\nkind: Config\nclusters:\n- name: sink\n  cluster:\n" + cluster +
		"users:\n- name: apiserver\n" + user +
		"contexts:\n- name: default\n  context: {cluster: sink, user: apiserver}\ncurrent-context: default\n"
}
