package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stampguard/stampguard/policy/admission"
	"github.com/stampguard/stampguard/test/bintest"
	"github.com/stampguard/stampguard/test/chtest"
	"github.com/stampguard/stampguard/test/kubetest"
	"github.com/stampguard/stampguard/test/pkitest"
	"github.com/stampguard/stampguard/test/promtest"
)

// metricName is a stampguard or auditsink metric named in PromQL.
var metricName = regexp.MustCompile(`\b(?:stampguard|auditsink)_[a-z0-9_]+\b`)

// exposedNames reads a /metrics page into the set of sample names.
func exposedNames(t *testing.T, addr string) map[string]bool {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("scrape %s: %v", addr, err)
	}
	defer resp.Body.Close()
	names := map[string]bool{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if i := strings.IndexAny(line, "{ "); i > 0 {
			names[line[:i]] = true
		}
	}
	return names
}

// promQLOfAlertsAndPanels is every PromQL text an alert or a panel holds:
// the chart's PrometheusRule (expressions, and the queries of its
// annotation templates) and the expr fields of the generated Grafana
// dashboards and alert rules (Prometheus-based panels and rules).
func promQLOfAlertsAndPanels(t *testing.T, root string) map[string][]string {
	t.Helper()
	byFile := map[string][]string{}
	rules, err := promtest.ChartRules(filepath.Join(root, "bin", "helm"), filepath.Join(root, "charts", "stampguard"))
	if err != nil {
		t.Fatalf("render the chart's rules (make helm installs bin/helm): %v", err)
	}
	byFile["charts/stampguard (PrometheusRule)"] = []string{string(rules)}
	files, err := filepath.Glob(filepath.Join(root, "dashboards", "generated", "*"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no generated dashboards (%v)", err)
	}
	exprField := regexp.MustCompile(`"?expr"?:\s*(.*)`)
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range exprField.FindAllStringSubmatch(string(b), -1) {
			byFile[filepath.Base(f)] = append(byFile[filepath.Base(f)], m[1])
		}
	}
	return byFile
}

// admissionReview is a review of an update of a Deployment in shop
// without resourceVersion: examples/policies.yaml denies it.
func admissionReview(uid string) []byte {
	obj := `{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"web","namespace":"shop","labels":{"team":"a"}},"spec":{"replicas":3,"selector":{"matchLabels":{"app":"web"}},"template":{"metadata":{"labels":{"app":"web"}},"spec":{"containers":[{"name":"c","image":"x"}]}}}}`
	old := strings.Replace(obj, `"metadata":{`, `"metadata":{"resourceVersion":"7",`, 1)
	return []byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"` + uid + `",` +
		`"kind":{"group":"apps","version":"v1","kind":"Deployment"},"resource":{"group":"apps","version":"v1","resource":"deployments"},` +
		`"requestKind":{"group":"apps","version":"v1","kind":"Deployment"},"requestResource":{"group":"apps","version":"v1","resource":"deployments"},` +
		`"name":"web","namespace":"shop","operation":"UPDATE","userInfo":{"username":"alice"},` +
		`"object":` + obj + `,"oldObject":` + old + `,"options":{"apiVersion":"meta.k8s.io/v1","kind":"UpdateOptions"}}}`)
}

// TestAlertsAndPanelsNameRegisteredMetrics starts the built webhook and
// `auditsink serve` with the flags the chart gives them, drives each so
// that every labelled series exists (a denied review, a malformed one, a
// batch of real audit events with a version conflict, a refused batch),
// scrapes their /metrics, and checks that every stampguard_ and
// auditsink_ metric an alert or a panel names is one of theirs.
func TestAlertsAndPanelsNameRegisteredMetrics(t *testing.T) {
	root := kubetest.RepoRoot(t)
	webhook := bintest.Build(t, "./cmd/webhook")
	auditsink := bintest.Build(t, "./cmd/auditsink")
	dir := t.TempDir()

	// The webhook in file mode, serving TLS from a cert dir.
	certDir := filepath.Join(dir, "webhook-tls")
	if err := os.MkdirAll(certDir, 0o700); err != nil {
		t.Fatal(err)
	}
	pkitest.NewCA("e2e-ca").Server("webhook", "127.0.0.1").WriteFiles(t, certDir)
	probes, serving := freeAddr(t), freeAddr(t)
	host, port, _ := net.SplitHostPort(serving)
	wh := startProcess(t, nil, webhook, "--policy-file", filepath.Join(root, "examples", "policies.yaml"),
		"--probe-addr", probes, "--cert-dir", certDir, "--host", host, "--port", port, "--log-format", "text")
	wh.waitFor("/readyz answering 200", func() error { return httpStatus(http.DefaultClient, "http://"+probes+"/readyz", http.StatusOK) })
	c := sinkClient()
	for i, body := range [][]byte{admissionReview("denied-1"), []byte(`{"kind":"AdmissionReview"`)} {
		resp, err := c.Post("https://"+serving+admission.StampPath, "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatalf("review %d: %v", i, err)
		}
		var out struct {
			Response struct {
				Allowed bool `json:"allowed"`
			} `json:"response"`
		}
		_ = json.NewDecoder(resp.Body).Decode(&out)
		resp.Body.Close()
		if i == 0 && (resp.StatusCode != 200 || out.Response.Allowed) {
			t.Fatalf("the stampless update's review: HTTP %d, allowed %v; want a denial", resp.StatusCode, out.Response.Allowed)
		}
	}

	// The sink, against a real ClickHouse.
	ch := chtest.Start(t)
	_, addr, metricsAddr := faultSink(t, auditsink, dir, ch, "--lost-updates-every", "1s")
	body, _ := batchOf(t, root, "metrics", 9) // the real events: a version conflict among them
	if code, _, b := postBatch(c, addr, "/clusters/prod/events", body); code != 200 {
		t.Fatalf("batch: HTTP %d %s", code, b)
	}
	// A lost update, for auditsink_lost_updates: alice creates a
	// ConfigMap, bob PUTs his own without a stamp over it.
	if code, _, b := postBatch(c, addr, "/clusters/prod/events", lostUpdateBatch(time.Now().UTC())); code != 200 {
		t.Fatalf("lost-update batch: HTTP %d %s", code, b)
	}
	deadline := time.Now().Add(time.Minute)
	for !exposedNames(t, metricsAddr)["auditsink_lost_updates"] {
		if time.Now().After(deadline) {
			t.Fatal("auditsink_lost_updates is not exposed a minute after a batch with a lost update (counted every 1s)")
		}
		time.Sleep(500 * time.Millisecond)
	}
	req, _ := http.NewRequest(http.MethodPost, "https://"+addr+"/clusters/prod/events", strings.NewReader("{}"))
	if resp, err := c.Do(req); err == nil { // no token: refused as unauthorized
		resp.Body.Close()
	}

	exposed := map[string]bool{}
	for _, a := range []string{probes, metricsAddr} {
		for n := range exposedNames(t, a) {
			exposed[n] = true
		}
	}
	for _, want := range []string{"auditsink_conflicts_total", "auditsink_hot_object_version_conflicts", "stampguard_admission_decisions_total", "auditsink_lost_updates"} {
		if !exposed[want] {
			t.Fatalf("%s is not exposed after the traffic that makes it: the check below would be weak", want)
		}
	}
	checked := 0
	for file, texts := range promQLOfAlertsAndPanels(t, root) {
		var missing []string
		for _, text := range texts {
			for _, name := range metricName.FindAllString(text, -1) {
				checked++
				if !exposed[name] && !slices.Contains(missing, name) {
					missing = append(missing, name)
				}
			}
		}
		if len(missing) > 0 {
			t.Errorf("%s names metrics no binary registers: %s", file, strings.Join(missing, ", "))
		}
	}
	if checked < 20 {
		t.Fatalf("only %d metric names found in the alerts and panels: the extraction is broken", checked)
	}
	t.Logf("%d metric references checked against %d exposed names", checked, len(exposed))
	if code := wh.stop(); code != 0 {
		t.Errorf("webhook: exit %d after SIGTERM", code)
	}
}

// lostUpdateBatch is an EventList of two writes logged at RequestResponse
// at now: alice creates configmap e2e/flags (data.mode on), bob updates it
// without a resourceVersion to his own copy (data.mode off), a stampless
// lost update.
func lostUpdateBatch(now time.Time) []byte {
	at := now.Format(time.RFC3339Nano)
	event := func(id, user, verb, uri string, code int, reqRV, respRV, mode string) string {
		req := `{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"flags","namespace":"e2e"` + reqRV + `},"data":{"mode":"` + mode + `"}}`
		resp := `{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"flags","namespace":"e2e","resourceVersion":"` + respRV + `"},"data":{"mode":"` + mode + `"}}`
		return fmt.Sprintf(`{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"RequestResponse","auditID":%q,"stage":"ResponseComplete",`+
			`"requestURI":%q,"verb":%q,"user":{"username":%q},"objectRef":{"resource":"configmaps","namespace":"e2e","name":"flags","apiVersion":"v1"},`+
			`"responseStatus":{"metadata":{},"code":%d},"requestObject":%s,"responseObject":%s,"requestReceivedTimestamp":%q,"stageTimestamp":%q}`,
			id, uri, verb, user, code, req, resp, at, at)
	}
	return []byte(`{"kind":"EventList","apiVersion":"audit.k8s.io/v1","items":[` +
		event("3f0c7a52-0000-4000-8000-000000000001", "alice", "create", "/api/v1/namespaces/e2e/configmaps", 201, "", "700", "on") + "," +
		event("3f0c7a52-0000-4000-8000-000000000002", "bob", "update", "/api/v1/namespaces/e2e/configmaps/flags", 200, "", "701", "off") + `]}`)
}
