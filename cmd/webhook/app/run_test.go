package app

import (
	"bytes"
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stampguard/stampguard/internal/cli"
	"github.com/stampguard/stampguard/policy"
	"github.com/stampguard/stampguard/policy/admission"
	"github.com/stampguard/stampguard/policy/admission/admissiontest"
	"github.com/stampguard/stampguard/policy/webhookconfig"
	"github.com/stampguard/stampguard/test/pkitest"
)

func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

const filePolicy = `apiVersion: stampguard.dev/v1alpha1
kind: ConcurrencyPolicy
metadata: {name: deployments}
spec:
  match: {resources: [{group: apps, resource: deployments}]}
  requireResourceVersion: true
`

// TestRunFileMode starts the whole webhook process logic in file mode: TLS
// admission endpoints, probes and metrics, and a graceful stop.
func TestRunFileMode(t *testing.T) {
	dir := t.TempDir()
	ca := pkitest.NewCA("test-ca")
	first := ca.Server("stampguard-test", "127.0.0.1")
	first.WriteFiles(t, dir)
	file := filepath.Join(dir, "policies.yaml")
	if err := os.WriteFile(file, []byte(filePolicy), 0o600); err != nil {
		t.Fatal(err)
	}
	port, probePort := freePort(t), freePort(t)
	ctx2, cancel := context.WithCancel(t.Context())
	defer cancel()
	ready := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx2, Options{
			Host: "127.0.0.1", Port: port, CertDir: dir, ProbeAddr: "127.0.0.1:" + strconv.Itoa(probePort),
			PolicyFile: file, Logger: slog.New(slog.DiscardHandler), Ready: func(a string) { ready <- a },
		})
	}()
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("Run: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("not ready after 30s")
	}
	probe := "http://127.0.0.1:" + strconv.Itoa(probePort)
	for _, path := range []string{"/healthz", "/readyz"} {
		resp, err := http.Get(probe + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("%s: HTTP %d", path, resp.StatusCode)
		}
	}

	// A stampless update through TLS is refused by the file's policy.
	cur := admissiontest.BigDeployment(3, "x", "a")
	cur.ResourceVersion = ""
	body := admissiontest.UpdateReview(t, "alice", admissiontest.BigDeployment(3, "x", "a"), cur)
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // a test certificate
	resp, err := client.Post("https://127.0.0.1:"+strconv.Itoa(port)+admission.StampPath, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	answer, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(answer), `"allowed":false`) || !strings.Contains(string(answer), `ConcurrencyPolicy \"deployments\"`) {
		t.Fatalf("answer %s", answer)
	}

	// A second review on the kept connection costs no handshake.
	resp, err = client.Post("https://127.0.0.1:"+strconv.Itoa(port)+admission.StampPath, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()

	resp, err = http.Get(probe + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`stampguard_policies{state="ready"} 1`,
		`stampguard_admission_requests_total{endpoint="stamp"} 2`,
		`stampguard_admission_connections_total 1`,
		`stampguard_admission_decisions_total{action="Deny",endpoint="stamp",outcome="denied",policy="deployments",rule="stamp-missing"} 2`,
	} {
		if !strings.Contains(string(metrics), want) {
			t.Errorf("metrics lack %s", want)
		}
	}

	// Certificates are reloaded when they change on disk.
	servedSerial := func() int64 {
		conn, err := tls.Dial("tcp", "127.0.0.1:"+strconv.Itoa(port), &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // a test certificate
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0].SerialNumber.Int64()
	}
	if got := servedSerial(); got != first.Serial() {
		t.Fatalf("serving certificate %d, want %d", got, first.Serial())
	}
	renewed := ca.Server("stampguard-test", "127.0.0.1")
	renewed.WriteFiles(t, dir)
	deadline := time.Now().Add(30 * time.Second)
	for servedSerial() != renewed.Serial() {
		if time.Now().After(deadline) {
			t.Fatal("the new certificate was not served within 30s")
		}
		time.Sleep(200 * time.Millisecond)
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run after cancel: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not stop")
	}
}

func TestRunRefusesABadPolicyFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(file, []byte(strings.Replace(filePolicy, "requireResourceVersion: true", "immutableFields: [{path: 'spec..x'}]", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	err := Run(t.Context(), Options{PolicyFile: file, ProbeAddr: "0", Logger: slog.New(slog.DiscardHandler)})
	if err == nil || !strings.Contains(err.Error(), file) || !strings.Contains(err.Error(), "spec.immutableFields[0].path") {
		t.Fatalf("want an error naming the file and the field, got %v", err)
	}
}

func TestRunRefusesToSyncConfigurationsInFileMode(t *testing.T) {
	err := Run(t.Context(), Options{PolicyFile: "policies.yaml", ProbeAddr: "0", Configurations: &webhookconfig.ConfigOptions{},
		Logger: slog.New(slog.DiscardHandler)})
	if err == nil || !strings.Contains(err.Error(), "cluster mode") {
		t.Fatalf("want an error saying the sync needs cluster mode, got %v", err)
	}
}

// TestNotReadyUntilThePoliciesAreLoaded: in cluster mode /readyz fails
// until the first policy set is in force, and says so; /healthz does not.
func TestNotReadyUntilThePoliciesAreLoaded(t *testing.T) {
	src := &ClusterSource{}
	mux := probeMux(prometheus.NewRegistry(), src.Ready)
	get := func(path string) (int, string) {
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequestWithContext(t.Context(), http.MethodGet, path, nil))
		return rec.Code, rec.Body.String()
	}
	if code, _ := get("/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz answered %d before the policies were loaded: liveness would restart the webhook", code)
	}
	if code, body := get("/readyz?verbose"); code != http.StatusInternalServerError && code != http.StatusServiceUnavailable {
		t.Fatalf("/readyz answered %d %q before the policies were loaded", code, body)
	}
	src.set.Store(policy.NewSet())
	if code, body := get("/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz answered %d %q with the policies loaded", code, body)
	}
}

// controller-runtime's webhook server announces its own shutdown timeout
// of a minute; the line tells the one that applies.
func TestRuntimeLoggerTellsTheShutdownTimeout(t *testing.T) {
	var out bytes.Buffer
	log, err := cli.NewLogger(&out, "info", "text")
	if err != nil {
		t.Fatal(err)
	}
	rl := RuntimeLogger(log, 25*time.Second).WithName("webhook").WithValues("k", "v")
	rl.Info("Shutting down webhook server with timeout of 1 minute")
	rl.Info("Serving webhook server", "port", 9443)
	got := out.String()
	if !strings.Contains(got, "Shutting down webhook server with timeout of 25s (--shutdown-timeout)") || strings.Contains(got, "1 minute") ||
		!strings.Contains(got, "Serving webhook server") || !strings.Contains(got, "k=v") {
		t.Errorf("logged:\n%s", got)
	}
}
