package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/stampguard/stampguard/policy"
	"github.com/stampguard/stampguard/policy/api/v1alpha1"
	"github.com/stampguard/stampguard/policy/webhookconfig"
	"github.com/stampguard/stampguard/test/pkitest"
)

// sink is the running `auditsink serve`.
type sink struct {
	*proc
	addr, metrics, caFile string
}

// startSink runs the built auditsink as the README says: TLS, a bearer
// token from a file, the DSN from $AUDITSINK_CLICKHOUSE_DSN.
func (d *demo) startSink(ctx context.Context, token string) (*sink, error) {
	pki, err := newPKI(filepath.Join(d.state, "sink-tls"))
	if err != nil {
		return nil, fmt.Errorf("sink certificates: %w", err)
	}
	tokenFile := filepath.Join(d.state, "sink-tls", "token")
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		return nil, err
	}
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	metrics, err := freeAddr()
	if err != nil {
		return nil, err
	}
	p, err := d.startProc("auditsink", filepath.Join(d.bin, "auditsink"), []string{"serve",
		"--listen", addr, "--tls-cert", pki.cert, "--tls-key", pki.key, "--token-file", tokenFile,
		"--spool-dir", filepath.Join(d.state, "spool"), "--metrics-listen", metrics, "--cluster", cluster,
		"--log-level", "warn", "--lost-updates-every", lostUpdatesEvery,
	}, []string{"AUDITSINK_CLICKHOUSE_DSN=" + d.dsn()})
	if err != nil {
		return nil, err
	}
	d.onStop("the audit sink", p.stop)
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pki.pool}}}
	if err := p.waitReady(ctx, "https://"+addr+"/healthz", time.Minute, httpOK(hc, "https://"+addr+"/healthz")); err != nil {
		return nil, fmt.Errorf("the audit sink would not start: %w", err)
	}
	return &sink{proc: p, addr: addr, metrics: metrics, caFile: pki.caFile}, nil
}

// dsn is the demo ClickHouse's native DSN (default user, no password).
func (d *demo) dsn() string { return fmt.Sprintf("clickhouse://127.0.0.1:%d", d.ch.Port) }

// startWebhook runs the built webhook in cluster mode with envtest's
// serving certificates and registers it with the configurations that the
// built `webhook configurations` prints.
func (d *demo) startWebhook(ctx context.Context, kubeconfig string) error {
	env := d.env
	probe, err := freeAddr()
	if err != nil {
		return err
	}
	p, err := d.startProc("webhook", filepath.Join(d.bin, "webhook"), []string{
		"--kubeconfig", kubeconfig, "--sync-configurations", webhookconfig.DefaultConfigName, "--host", env.WebhookHost, "--port", strconv.Itoa(env.WebhookPort),
		"--cert-dir", env.CertDir, "--probe-addr", probe, "--namespace", "stampguard-system",
		"--log-format", "text", "--log-level", "info",
	}, nil)
	if err != nil {
		return err
	}
	d.webhook, d.probes = p, probe
	d.onStop("the webhook", p.stop)
	if err := p.waitReady(ctx, "http://"+probe+"/readyz", time.Minute, httpOK(http.DefaultClient, "http://"+probe+"/readyz")); err != nil {
		return fmt.Errorf("the webhook would not start: %w", err)
	}
	d.note("%s (probes on %s), log %s", env.WebhookURL(), probe, d.rel(p.log))
	caFile := filepath.Join(d.state, "webhook-ca.crt")
	if err := os.WriteFile(caFile, env.CAData, 0o644); err != nil {
		return err
	}
	objs, how, err := d.webhookConfigurations(ctx, env.WebhookURL(), caFile)
	if err != nil {
		return err
	}
	d.note("%s", d.relArgs(how))
	for _, o := range objs {
		kind := o.GetObjectKind().GroupVersionKind().Kind
		if err := env.Client.Create(ctx, o); err != nil {
			return fmt.Errorf("register %s %s: %w", kind, o.GetName(), err)
		}
		d.note("registered %s %q", kind, o.GetName())
	}
	return nil
}

// webhookConfigurations are the Mutating- and ValidatingWebhookConfiguration
// that route guarded writes to the webhook at url, as the built
// `webhook configurations` prints them for a user to apply.
func (d *demo) webhookConfigurations(ctx context.Context, url, caFile string) ([]client.Object, string, error) {
	args := []string{"configurations", "--url", url, "--ca-bundle", caFile}
	cmd := exec.CommandContext(ctx, filepath.Join(d.bin, "webhook"), args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, "", fmt.Errorf("webhook %s: %w\n%s", strings.Join(args, " "), err, stderr.String())
	}
	dec := serializer.NewCodecFactory(d.env.Scheme).UniversalDeserializer()
	var objs []client.Object
	for _, doc := range strings.Split(string(out), "\n---\n") {
		if strings.TrimSpace(doc) == "" {
			continue
		}
		obj, _, err := dec.Decode([]byte(doc), nil, nil)
		if err != nil {
			return nil, "", fmt.Errorf("decode the output of webhook configurations: %w", err)
		}
		co, ok := obj.(client.Object)
		if !ok {
			return nil, "", fmt.Errorf("webhook configurations printed a %T", obj)
		}
		objs = append(objs, co)
	}
	if len(objs) != 2 {
		return nil, "", fmt.Errorf("webhook configurations printed %d objects, want the mutating and the validating configuration", len(objs))
	}
	return objs, "webhook " + strings.Join(args, " "), nil
}

// applyPolicies creates the policies and waits until the webhook has
// loaded each one (its Ready condition).
func (d *demo) applyPolicies(ctx context.Context) error {
	// LoadFile names the document and field of any mistake; the objects
	// themselves are decoded from the same documents.
	if _, err := policy.LoadFile(d.o.policies); err != nil {
		return err
	}
	data, err := os.ReadFile(d.o.policies)
	if err != nil {
		return err
	}
	var ps []*v1alpha1.ConcurrencyPolicy
	for _, doc := range strings.Split(string(data), "\n---") {
		p := &v1alpha1.ConcurrencyPolicy{}
		if err := yaml.Unmarshal([]byte(doc), p); err != nil {
			return fmt.Errorf("%s: %w", d.o.policies, err)
		}
		if p.Name == "" {
			continue
		}
		if err := d.env.Client.Create(ctx, p); err != nil {
			return fmt.Errorf("create ConcurrencyPolicy %s: %w", p.Name, err)
		}
		ps = append(ps, p)
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, p := range ps {
		for {
			var got v1alpha1.ConcurrencyPolicy
			err := d.env.Client.Get(ctx, client.ObjectKey{Name: p.Name}, &got)
			c := apimeta.FindStatusCondition(got.Status.Conditions, "Ready")
			if err == nil && c != nil && c.Status == metav1.ConditionTrue {
				d.note("ConcurrencyPolicy %q: %s", p.Name, describe(&got))
				break
			}
			if err == nil && c != nil && c.Status == metav1.ConditionFalse {
				return fmt.Errorf("the webhook refused ConcurrencyPolicy %s: %s", p.Name, c.Message)
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("the webhook did not load ConcurrencyPolicy %s within 30s (log: %s)", p.Name, d.webhook.log)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return nil
}

// describe sums a policy up in a few words.
func describe(p *v1alpha1.ConcurrencyPolicy) string {
	var what []string
	for _, r := range p.Spec.Match.Resources {
		what = append(what, r.Resource)
	}
	s := string(p.Spec.Action) + " on " + strings.Join(what, ",")
	if len(p.Spec.Match.Namespaces) > 0 {
		s += " in " + strings.Join(p.Spec.Match.Namespaces, ",")
	}
	var rules []string
	if p.Spec.RequireResourceVersion {
		rules = append(rules, "stampless updates")
	}
	for _, f := range p.Spec.FieldOwners {
		rules = append(rules, f.Path+" owned by "+strings.Join(append(append(f.Writers.ServiceAccounts, f.Writers.Users...), f.Writers.Groups...), ","))
	}
	for _, f := range p.Spec.ImmutableFields {
		rules = append(rules, f.Path+" immutable")
	}
	return s + ": " + strings.Join(rules, "; ")
}

// recordPorts writes run/ports: every TCP socket a demo process listens
// on ("name address port"), so that the e2e test can check that they are
// all on loopback and that none remains after the demo.
func (d *demo) recordPorts() error {
	files, err := filepath.Glob(filepath.Join(d.pids, "*.pid"))
	if err != nil {
		return err
	}
	var lines []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		num, _, _ := strings.Cut(string(b), "\n")
		pid, _ := strconv.Atoi(strings.TrimSpace(num))
		ls, err := listeners(pid)
		if err != nil {
			return fmt.Errorf("ports of %s: %w", filepath.Base(f), err)
		}
		name := strings.TrimSuffix(filepath.Base(f), ".pid")
		for _, l := range ls {
			lines = append(lines, name+" "+l.addr.String()+" "+strconv.Itoa(l.port))
		}
	}
	sort.Strings(lines)
	return os.WriteFile(filepath.Join(d.state, "ports"), []byte(strings.Join(lines, "\n")+"\n"), 0o644)
}

// writeKubeconfig writes cfg (envtest's admin) as a kubeconfig file.
func writeKubeconfig(path string, cfg *rest.Config) error {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["demo"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["admin"] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData, Token: cfg.BearerToken}
	kc.Contexts["demo"] = &clientcmdapi.Context{Cluster: "demo", AuthInfo: "admin"}
	kc.CurrentContext = "demo"
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		return fmt.Errorf("write kubeconfig: %w", err)
	}
	return nil
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("pick a free loopback port: %w", err)
	}
	defer l.Close()
	return l.Addr().String(), nil
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

type pki struct {
	caFile, cert, key string
	pool              *x509.CertPool
}

// newPKI writes a throwaway CA (pkitest's, valid for 30 days) and its
// serving certificate for 127.0.0.1 into dir.
func newPKI(dir string) (*pki, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	ca := pkitest.NewCA("stampguard-demo-ca")
	serving := ca.Server("auditsink", "127.0.0.1")
	p := &pki{caFile: filepath.Join(dir, "ca.crt"), cert: filepath.Join(dir, "tls.crt"), key: filepath.Join(dir, "tls.key"), pool: ca.Pool()}
	for path, b := range map[string][]byte{p.caFile: ca.PEM, p.cert: serving.CertPEM, p.key: serving.KeyPEM} {
		if err := os.WriteFile(path, b, 0o600); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// relArgs shows the paths in a command line relative to the repository.
func (d *demo) relArgs(cmdline string) string {
	f := strings.Fields(cmdline)
	for i := range f {
		if filepath.IsAbs(f[i]) {
			f[i] = d.rel(f[i])
		}
	}
	return strings.Join(f, " ")
}
