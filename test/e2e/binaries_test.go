package e2e

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/stampguard/stampguard/policy/admission"
	"github.com/stampguard/stampguard/policy/api/v1alpha1"
	"github.com/stampguard/stampguard/test/bintest"
	"github.com/stampguard/stampguard/test/chtest"
	"github.com/stampguard/stampguard/test/kubetest"
)

// exitBound is how long a process may take to exit after SIGTERM: the
// kubelet's default grace period. A bound, not a timing.
const exitBound = 30 * time.Second

// process is a built command running as a child of the test; it is killed
// at cleanup if it is still running.
type process struct {
	t    testing.TB
	name string
	cmd  *exec.Cmd
	out  syncBuffer // stdout and stderr
	done chan struct{}
	err  error
}

func startProcess(t testing.TB, env []string, bin string, args ...string) *process {
	t.Helper()
	p := &process{t: t, name: filepath.Base(bin) + " " + strings.Join(args, " "), done: make(chan struct{})}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Env = env
	p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", p.name, err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Kill()
			<-p.done
			t.Logf("%s was killed at cleanup; its output:\n%s", p.name, p.out.String())
		}
	})
	return p
}

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM and returns the exit code; the test fails unless the
// process exits within exitBound.
func (p *process) stop() int {
	p.t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		p.t.Fatalf("SIGTERM %s: %v", p.name, err)
	}
	return p.wait(exitBound)
}

func (p *process) wait(bound time.Duration) int {
	p.t.Helper()
	select {
	case <-p.done:
		return bintest.ExitCode(p.err)
	case <-time.After(bound):
		p.t.Fatalf("%s still running %s after SIGTERM; output:\n%s", p.name, bound, p.out.String())
		return -1
	}
}

// waitFor polls cond until it holds, failing when the process exits first
// or after a minute.
func (p *process) waitFor(what string, cond func() error) {
	p.t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		err := cond()
		if err == nil {
			return
		}
		if p.exited() {
			p.t.Fatalf("%s exited (%v) before %s; output:\n%s", p.name, p.err, what, p.out.String())
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("%s: still no %s after a minute: %v; output:\n%s", p.name, what, err, p.out.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// runBinary runs a command to its end and returns its stdout, stderr and
// exit code.
func runBinary(t *testing.T, env []string, bin string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = env
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		code = bintest.ExitCode(err)
		if code < 0 {
			t.Fatalf("%s %s: %v", bin, strings.Join(args, " "), err)
		}
	case <-time.After(2 * time.Minute):
		_ = cmd.Process.Kill()
		t.Fatalf("%s %s did not end within 2 minutes", bin, strings.Join(args, " "))
	}
	return o.String(), e.String(), code
}

// TestWebhookBinary starts the built webhook as users do: in file mode with
// TLS material and probes, registered through the YAML that the built
// `webhook configurations` prints, then in cluster mode from a kubeconfig
// file; each is stopped with SIGTERM.
func TestWebhookBinary(t *testing.T) {
	webhook := bintest.Build(t, "./cmd/webhook")
	env := kubetest.Start(t, kubetest.Options{})
	root := kubetest.RepoRoot(t)
	dir := t.TempDir()
	caFile := filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(caFile, env.CAData, 0o600); err != nil {
		t.Fatal(err)
	}
	admin := env.Client
	ctx := t.Context()
	serving := []string{"--cert-dir", env.CertDir, "--host", env.WebhookHost, "--port", strconv.Itoa(env.WebhookPort), "--log-format", "text"}
	tlsClient := webhookClient(t, env.CAData)

	t.Run("webhook configurations output, applied to the apiserver, registers the webhook", func(t *testing.T) {
		// Routing what the file mode's policies guard; the cluster mode
		// below narrows them to the live policies (--sync-configurations,
		// whose default names these: "stampguard").
		out, stderr, code := runBinary(t, nil, webhook, "configurations", "--url", env.WebhookURL(), "--ca-bundle", caFile,
			"--resources", "apps/deployments,configmaps", "--policy-file", filepath.Join(root, "examples", "policies.yaml"))
		if code != 0 {
			t.Fatalf("exit %d: %s", code, stderr)
		}
		objs := decodeObjects(t, env, out)
		if len(objs) != 2 {
			t.Fatalf("%d objects in the output, want 2:\n%s", len(objs), out)
		}
		for _, obj := range objs {
			create(t, admin, obj)
		}
	})
	namespace(t, admin, "shop", nil) // where examples/policies.yaml applies

	t.Run("file mode", func(t *testing.T) {
		probes := freeAddr(t)
		p := startProcess(t, nil, webhook, append([]string{"--policy-file", filepath.Join(root, "examples", "policies.yaml"), "--probe-addr", probes}, serving...)...)
		p.waitFor("/readyz answering 200", func() error { return httpStatus(http.DefaultClient, "http://"+probes+"/readyz", http.StatusOK) })
		create(t, admin, deployment("shop", "web", 3)) // the configurations send it to the process

		t.Run("/healthz, /readyz and /metrics answer", func(t *testing.T) {
			for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
				if err := httpStatus(http.DefaultClient, "http://"+probes+path, http.StatusOK); err != nil {
					t.Error(err)
				}
			}
			if v := metricValue(t, probes, `stampguard_policies{state="ready"}`); v != 2 {
				t.Errorf("stampguard_policies ready = %v, want the example file's 2", v)
			}
		})
		t.Run("the apiserver refuses a stampless update through the process", func(t *testing.T) {
			alice := env.ClientAs(t, "alice")
			// Polls until the apiserver's informer has the configurations.
			p.waitFor("a refusal of a stampless update", func() error {
				err := alice.Update(ctx, deployment("shop", "web", 3))
				if err == nil {
					return errors.New("the stampless update passed")
				}
				if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), `admission webhook "stamp.stampguard.dev" denied the request`) {
					return fmt.Errorf("not the webhook's 422: %w", err)
				}
				return nil
			})
			cs := kubernetes.NewForConfigOrDie(env.As("alice"))
			s, err := cs.AppsV1().Deployments("shop").GetScale(ctx, "web", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			s.ResourceVersion = ""
			if _, err := cs.AppsV1().Deployments("shop").UpdateScale(ctx, "web", s, metav1.UpdateOptions{}); !apierrors.IsInvalid(err) {
				t.Fatalf("a stampless Scale PUT: want 422, got %v", err)
			}
		})
		t.Run("oversized reviews leave the RSS bounded", func(t *testing.T) {
			oversizedReviews(t, p, tlsClient, "https://"+net.JoinHostPort(env.WebhookHost, strconv.Itoa(env.WebhookPort)), probes)
		})
		t.Run("SIGTERM drains the review in flight and exits 0 within the grace period", func(t *testing.T) {
			drainOnSIGTERM(t, p, env, probes)
		})
	})

	t.Run("a review that never completes holds SIGTERM no longer than --shutdown-timeout", func(t *testing.T) {
		probes := freeAddr(t)
		p := startProcess(t, nil, webhook, append([]string{"--policy-file", filepath.Join(root, "examples", "policies.yaml"),
			"--probe-addr", probes, "--shutdown-timeout", "2s"}, serving...)...)
		p.waitFor("/readyz answering 200", func() error { return httpStatus(http.DefaultClient, "http://"+probes+"/readyz", http.StatusOK) })
		halfSentReview(t, p, env, probes) // and never the rest
		if code := p.stop(); code != 1 {
			t.Fatalf("exit code %d, want 1 for an abandoned review; output:\n%s", code, p.out.String())
		}
		if out := p.out.String(); !strings.Contains(out, "reviews still in flight after the shutdown timeout of 2s") {
			t.Fatalf("the output does not say why it stopped:\n%s", out)
		}
	})

	t.Run("cluster mode from a kubeconfig", func(t *testing.T) {
		kubeconfig := writeKubeconfig(t, env.Config, filepath.Join(dir, "kubeconfig"))
		probes := freeAddr(t)
		p := startProcess(t, nil, webhook, append([]string{"--kubeconfig", kubeconfig, "--probe-addr", probes, "--namespace", "stampguard-system",
			"--sync-resources", "apps/deployments,configmaps"}, serving...)...)
		p.waitFor("/readyz answering 200", func() error { return httpStatus(http.DefaultClient, "http://"+probes+"/readyz", http.StatusOK) })

		t.Run("a ConcurrencyPolicy created after the start is enforced", func(t *testing.T) {
			const ns = "cluster-bin"
			namespace(t, admin, ns, nil)
			alice := env.ClientAs(t, "alice")
			create(t, alice, configMap(ns, "cm", nil))
			if err := alice.Update(ctx, configMap(ns, "cm", nil)); err != nil {
				t.Fatalf("a stampless update was refused before any policy: %v", err)
			}
			create(t, admin, &v1alpha1.ConcurrencyPolicy{
				ObjectMeta: metav1.ObjectMeta{Name: "cluster-bin"},
				Spec: v1alpha1.ConcurrencyPolicySpec{
					Match:                  v1alpha1.Match{Resources: []v1alpha1.ResourceMatch{{Resource: "configmaps"}}, Namespaces: []string{ns}},
					RequireResourceVersion: true,
				},
			})
			p.waitFor("the new policy enforced", func() error {
				err := alice.Update(ctx, configMap(ns, "cm", nil))
				if err == nil {
					return errors.New("the stampless update passed")
				}
				if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), `ConcurrencyPolicy "cluster-bin"`) {
					return fmt.Errorf("not the policy's 422: %w", err)
				}
				return nil
			})
			if err := httpStatus(http.DefaultClient, "http://"+probes+"/readyz", http.StatusOK); err != nil {
				t.Error(err)
			}
		})
		t.Run("SIGTERM exits 0 within the grace period", func(t *testing.T) {
			if code := p.stop(); code != 0 {
				t.Fatalf("exit code %d after SIGTERM; output:\n%s", code, p.out.String())
			}
		})
	})
}

// webhookClient trusts the CA that signed the webhook's serving certificate.
func webhookClient(t *testing.T, ca []byte) *http.Client {
	t.Helper()
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		t.Fatal("the envtest CA is not PEM")
	}
	return &http.Client{Timeout: time.Minute, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
}

// decodeObjects reads a multi-document YAML stream as kubectl apply does:
// each document by its apiVersion and kind.
func decodeObjects(t *testing.T, env *kubetest.Env, stream string) []client.Object {
	t.Helper()
	dec := serializer.NewCodecFactory(env.Scheme).UniversalDeserializer()
	r := utilyaml.NewYAMLReader(bufio.NewReader(strings.NewReader(stream)))
	var out []client.Object
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("read YAML document: %v", err)
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		obj, gvk, err := dec.Decode(doc, nil, nil)
		if err != nil {
			t.Fatalf("decode %s: %v", doc, err)
		}
		co, ok := obj.(client.Object)
		if !ok {
			t.Fatalf("%s is not an object", gvk)
		}
		out = append(out, co)
	}
}

func httpStatus(c *http.Client, url string, want int) error {
	resp, err := c.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != want {
		return fmt.Errorf("GET %s: %d %s, want %d", url, resp.StatusCode, body, want)
	}
	return nil
}

// metricValue reads one sample, named with its labels as /metrics prints
// it, e.g. stampguard_policies{state="ready"}; 0 when absent.
func metricValue(t testing.TB, probes, sample string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + probes + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), sample+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %v", sc.Text(), err)
			}
			return f
		}
	}
	return 0
}

// rssBytes is a process's resident set size (VmRSS) from /proc.
func rssBytes(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatalf("read the process's status: %v", err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatalf("VmRSS %q: %v", v, err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmRSS in /proc status")
	return 0
}

// rssBound is what the webhook's RSS may grow by over a run of oversized
// reviews: about two review buffers at the 8 MiB limit (one being filled,
// its predecessor not yet collected) and slack for the runtime. Measured
// here: 29 -> 54 MiB; with the pooled buffers and the 16 MiB limit of
// before, 30 -> 453 MiB, and it stayed there.
const rssBound = 48 << 20

// oversizedReviews sends 20 MiB bodies to /stamp: eight at once with a
// Content-Length, as the apiserver sends them, and four chunked ones after
// each other, which the webhook must buffer to its limit to refuse. Every
// one is counted as refused, and the RSS stays within rssBound of where it
// started.
func oversizedReviews(t *testing.T, p *process, c *http.Client, base, probes string) {
	const size = 20 << 20
	big := bytes.Repeat([]byte("x"), size)
	before := rssBytes(t, p.cmd.Process.Pid)
	refused0 := metricValue(t, probes, `stampguard_admission_errors_total{endpoint="stamp",reason="too_large"}`)
	send := func(body io.Reader) {
		resp, err := c.Post(base+admission.StampPath, "application/json", body)
		if err != nil {
			return // the server may close the connection before the client finished writing; the counter tells
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		if resp.StatusCode != http.StatusRequestEntityTooLarge {
			t.Errorf("HTTP %d for a %d MiB review, want 413", resp.StatusCode, size>>20)
		}
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() { send(bytes.NewReader(big)) })
	}
	wg.Wait()
	for range 4 {
		send(io.MultiReader(bytes.NewReader(big))) // no length: sent chunked
	}
	p.waitFor("all 12 oversized reviews counted as refused", func() error {
		if n := metricValue(t, probes, `stampguard_admission_errors_total{endpoint="stamp",reason="too_large"}`) - refused0; n < 12 {
			return fmt.Errorf("%v refused", n)
		}
		return nil
	})
	after := rssBytes(t, p.cmd.Process.Pid)
	t.Logf("RSS %d MiB before, %d MiB after twelve %d MiB reviews", before>>20, after>>20, size>>20)
	if after-before > rssBound {
		t.Fatalf("RSS grew by %d MiB (from %d to %d MiB), more than %d MiB", (after-before)>>20, before>>20, after>>20, rssBound>>20)
	}
}

// halfSentReview opens a connection to the webhook and sends a review's
// headers and half its body, and returns once the webhook's handler holds
// it (the request counter moved): a review in flight. It returns the rest.
func halfSentReview(t *testing.T, p *process, env *kubetest.Env, probes string) (*tls.Conn, []byte) {
	t.Helper()
	const counter = `stampguard_admission_requests_total{endpoint="stamp"}`
	before := metricValue(t, probes, counter)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(env.CAData)
	addr := net.JoinHostPort(env.WebhookHost, strconv.Itoa(env.WebhookPort))
	conn, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: pool})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	review, err := json.Marshal(map[string]any{
		"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
		"request": map[string]any{
			"uid": "drain-1", "operation": "UPDATE", "namespace": "shop", "name": "cm",
			"resource": map[string]any{"group": "", "version": "v1", "resource": "configmaps"},
			"userInfo": map[string]any{"username": "alice"},
			"object":   corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "cm", ResourceVersion: "7"}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	half := len(review) / 2
	if _, err := fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
		admission.StampPath, addr, len(review), review[:half]); err != nil {
		t.Fatal(err)
	}
	// Past the TLS handshake and in the handler: a handshake still under
	// way when SIGTERM arrives is cut off by the webhook server.
	p.waitFor("the review in flight in the handler", func() error {
		if metricValue(t, probes, counter) == before {
			return errors.New("not yet")
		}
		return nil
	})
	return conn, review[half:]
}

// drainOnSIGTERM holds a review in flight (its body half sent), sends
// SIGTERM, waits until the webhook says it is shutting down, then sends the
// rest: the review is answered, and the process exits 0 within exitBound.
func drainOnSIGTERM(t *testing.T, p *process, env *kubetest.Env, probes string) {
	conn, rest := halfSentReview(t, p, env, probes)
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(exitBound)
	for !strings.Contains(p.out.String(), "Shutting down webhook server") {
		if p.exited() || time.Now().After(deadline) {
			t.Fatalf("the webhook never said it was shutting down; output:\n%s", p.out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := conn.Write(rest); err != nil {
		t.Fatalf("the connection of the review in flight was closed: %v", err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no answer to the review in flight: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"uid":"drain-1"`) || !strings.Contains(string(body), `"allowed":true`) {
		t.Fatalf("the review in flight got %d %s", resp.StatusCode, body)
	}
	if code := p.wait(time.Until(deadline)); code != 0 {
		t.Fatalf("exit code %d after SIGTERM; output:\n%s", code, p.out.String())
	}
}

// writeKubeconfig writes cfg as a kubeconfig file, as a user outside the
// cluster would have one.
func writeKubeconfig(t testing.TB, cfg *rest.Config, path string) string {
	t.Helper()
	server := cfg.Host
	if !strings.Contains(server, "://") {
		server = "https://" + server
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["envtest"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["admin"] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData, Token: cfg.BearerToken}
	kc.Contexts["envtest"] = &clientcmdapi.Context{Cluster: "envtest", AuthInfo: "admin"}
	kc.CurrentContext = "envtest"
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestAuditsinkTailAndMigrateBinaries runs the two auditsink commands that
// the other e2e tests drive only in-process: `migrate` twice (the second
// applies nothing) and `tail` of a real apiserver's audit log until the
// events of a write land in ClickHouse; SIGTERM stops tail with exit 0.
func TestAuditsinkTailAndMigrateBinaries(t *testing.T) {
	auditsink := bintest.Build(t, "./cmd/auditsink")
	ch := chtest.Start(t)
	const db = "binaries"
	sinkEnv := append(os.Environ(), "AUDITSINK_CLICKHOUSE_DSN="+ch.DSN())

	t.Run("migrate twice is a no-op the second time", func(t *testing.T) {
		first, stderr, code := runBinary(t, sinkEnv, auditsink, "migrate", "--database", db)
		if code != 0 {
			t.Fatalf("first migrate: exit %d: %s", code, stderr)
		}
		second, stderr, code := runBinary(t, sinkEnv, auditsink, "migrate", "--database", db)
		if code != 0 {
			t.Fatalf("second migrate: exit %d: %s", code, stderr)
		}
		if strings.Contains(first, "applied now: []") || !strings.Contains(second, "applied now: []") {
			t.Fatalf("first migrate said %q, second %q; want migrations applied once", first, second)
		}
		if a, b := strings.Split(first, " (")[0], strings.Split(second, " (")[0]; a != b {
			t.Fatalf("the schema version moved: %q then %q", a, b)
		}
	})

	t.Run("tail follows a live audit log into ClickHouse", func(t *testing.T) {
		env := kubetest.Start(t, kubetest.Options{AuditPolicy: kubetest.DefaultAuditPolicy, AuditLog: true})
		p := startProcess(t, sinkEnv, auditsink, "tail", "--database", db, "--cluster", "tail-bin",
			"--checkpoint", filepath.Join(t.TempDir(), "checkpoint"), env.AuditLogPath)
		namespace(t, env.Client, "tail-bin", nil)
		create(t, env.Client, configMap("tail-bin", "tailed", nil))
		conn := ch.Conn(t, db)
		p.waitFor("the configmap's create in ClickHouse", func() error {
			var n uint64
			if err := conn.QueryRow(t.Context(), "SELECT count() FROM events_by_hour WHERE cluster = 'tail-bin' AND verb = 'create' AND resource = 'configmaps' AND name = 'tailed'").Scan(&n); err != nil {
				return err
			}
			if n == 0 {
				return errors.New("not stored yet")
			}
			return nil
		})
		if code := p.stop(); code != 0 {
			t.Fatalf("tail: exit code %d after SIGTERM; output:\n%s", code, p.out.String())
		}
	})
}
