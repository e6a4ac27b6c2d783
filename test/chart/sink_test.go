package chart

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/stampguard/stampguard/internal/chtest"
	"github.com/stampguard/stampguard/internal/testenv"
)

// TestSinkWiring starts the built auditsink with the rendered StatefulSet's
// init container (migrate) and container (serve) args, the chart's Secrets
// in their mount paths, against a real ClickHouse, and sends it a batch
// with the chart's generated token: the events land in ClickHouse with the
// release's cluster name.
func TestSinkWiring(t *testing.T) {
	testenv.SkipIfShort(t, "starts clickhouse-server and the auditsink binary")
	ch := chtest.Start(t)
	port, metrics := freePort(t), freePort(t)
	objs := objects(t, render(t, "", "webhook.enabled=false",
		"auditSink.port="+strconv.Itoa(port), "auditSink.metricsPort="+strconv.Itoa(metrics),
		"auditSink.clickhouse.dsn="+ch.DSN(), "auditSink.tls.extraIPAddresses={127.0.0.1}"))
	name := release + "-stampguard-auditsink"

	var sts appsv1.StatefulSet
	find(t, objs, "StatefulSet", name, &sts)
	spec := &sts.Spec.Template.Spec
	if len(spec.InitContainers) != 1 || len(spec.Containers) != 1 {
		t.Fatalf("want one init container (migrate) and one container, got %d and %d", len(spec.InitContainers), len(spec.Containers))
	}
	pod := podFiles(t, objs, sts.Namespace, spec)
	bin := buildBinary(t, "./cmd/auditsink")
	migrate := spec.InitContainers[0]
	out := run(t, bin, pod.remap(migrate.Args), pod.env(t, migrate))
	if !strings.Contains(out, "database stampguard at schema version") {
		t.Fatalf("migrate said: %s", out)
	}
	serve := spec.Containers[0]
	start(t, bin, pod.remap(serve.Args), pod.env(t, serve))

	var tlsSecret, tokenSecret corev1.Secret
	find(t, objs, "Secret", name+"-tls", &tlsSecret)
	find(t, objs, "Secret", name+"-token", &tokenSecret)
	c := tlsClient(t, tlsSecret.Data["ca.crt"])
	base := fmt.Sprintf("https://127.0.0.1:%d", port)
	waitHTTP(t, c, base+"/healthz")

	now := time.Now().UTC()
	var events []string
	var ids []string
	for i := range 3 {
		id := fmt.Sprintf("00000000-0000-4000-8000-%012d", now.UnixNano()%1e9*10+int64(i))
		ids = append(ids, "'"+id+"'")
		ts := now.Add(time.Duration(i) * time.Millisecond).Format(time.RFC3339Nano)
		events = append(events, `{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"`+id+`","stage":"ResponseComplete",`+
			`"requestURI":"/api/v1/namespaces/shop/configmaps/settings","verb":"update","user":{"username":"alice","groups":["system:authenticated"]},`+
			`"sourceIPs":["10.0.0.1"],"userAgent":"chart-test","objectRef":{"resource":"configmaps","namespace":"shop","name":"settings","apiVersion":"v1"},`+
			`"responseStatus":{"metadata":{},"code":200},"requestReceivedTimestamp":"`+ts+`","stageTimestamp":"`+ts+`"}`)
	}
	batch := `{"kind":"EventList","apiVersion":"audit.k8s.io/v1","metadata":{},"items":[` + strings.Join(events, ",") + `]}`

	post := func(token string) int {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, base+"/events", strings.NewReader(batch))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := post(""); code != http.StatusUnauthorized {
		t.Fatalf("a batch without the token: %d, want 401", code)
	}
	if code := post(string(tokenSecret.Data["token"])); code != http.StatusOK {
		t.Fatalf("a batch with the chart's token: %d, want 200", code)
	}

	conn := ch.Conn(t, "stampguard")
	query := "SELECT count() FROM events WHERE cluster = '" + release + "' AND audit_id IN (" + strings.Join(ids, ",") + ")"
	eventually(t, 30*time.Second, func() error {
		var n uint64
		if err := conn.QueryRow(t.Context(), query).Scan(&n); err != nil {
			return err
		}
		if n != uint64(len(ids)) {
			return fmt.Errorf("%d of %d events in ClickHouse", n, len(ids))
		}
		return nil
	})
}
