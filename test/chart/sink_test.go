package chart

import (
	"crypto/tls"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/stampguard/stampguard/test/bintest"
	"github.com/stampguard/stampguard/test/chtest"
	"github.com/stampguard/stampguard/test/pkitest"
	"github.com/stampguard/stampguard/test/testenv"
)

// TestSinkWiring starts the built auditsink with the rendered StatefulSet's
// init container (migrate) and container (serve) args, the chart's Secrets
// in their mount paths, against a real ClickHouse, and sends it a batch
// with the chart's auth: the generated bearer token, or a client
// certificate signed by the CA in an existing Secret. Unauthenticated
// batches are refused; authenticated ones land in ClickHouse under the
// release's cluster name.
func TestSinkWiring(t *testing.T) {
	testenv.SkipIfShort(t, "starts clickhouse-server and the auditsink binary")
	ch := chtest.Start(t)
	bin := bintest.Build(t, "./cmd/auditsink")
	name := release + "-stampguard-auditsink"
	// A client CA and certificate, as a platform makes them for the apiserver.
	clientCA := pkitest.NewCA("apiserver-client-ca")
	clientCert := clientCA.Client("kube-apiserver")

	for _, tc := range []struct {
		name    string
		cluster string
		sets    []string
		secrets []*corev1.Secret // exist before the install
	}{
		{name: "the generated bearer token", cluster: release},
		{
			name: "a client certificate", cluster: "mtls",
			sets: []string{"auditSink.cluster=mtls", "auditSink.auth.token.enabled=false",
				"auditSink.auth.clientCA.enabled=true", "auditSink.auth.clientCA.existingSecret=apiserver-client-ca"},
			secrets: []*corev1.Secret{{ObjectMeta: metav1.ObjectMeta{Name: "apiserver-client-ca"}, Data: map[string][]byte{"ca.crt": clientCA.PEM}}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			port, metrics := freePort(t), freePort(t)
			objs := objects(t, render(t, "", append([]string{"webhook.enabled=false",
				"auditSink.port=" + strconv.Itoa(port), "auditSink.metricsPort=" + strconv.Itoa(metrics),
				"auditSink.clickhouse.dsn=" + ch.DSN(), "auditSink.tls.extraIPAddresses={127.0.0.1}"}, tc.sets...)...))
			var sts appsv1.StatefulSet
			find(t, objs, "StatefulSet", name, &sts)
			spec := &sts.Spec.Template.Spec
			if len(spec.InitContainers) != 1 || len(spec.Containers) != 1 {
				t.Fatalf("want one init container (migrate) and one container, got %d and %d", len(spec.InitContainers), len(spec.Containers))
			}
			pod := podFiles(t, objs, sts.Namespace, spec, tc.secrets...)
			migrate := spec.InitContainers[0]
			if out := run(t, bin, pod.remap(migrate.Args), pod.env(t, migrate)); !strings.Contains(out, "database stampguard at schema version") {
				t.Fatalf("migrate said: %s", out)
			}
			serve := spec.Containers[0]
			start(t, bin, pod.remap(serve.Args), pod.env(t, serve), spec.TerminationGracePeriodSeconds)

			var tlsSecret corev1.Secret
			find(t, objs, "Secret", name+"-tls", &tlsSecret)
			anonymous := tlsClient(t, tlsSecret.Data["ca.crt"])
			base := fmt.Sprintf("https://127.0.0.1:%d", port)
			// The rendered probes' paths, as the kubelet calls them.
			waitHTTP(t, anonymous, base+serve.LivenessProbe.HTTPGet.Path)
			waitHTTP(t, anonymous, base+serve.ReadinessProbe.HTTPGet.Path)

			batch, ids := auditBatch(time.Now().UTC(), 3)
			post := func(c *http.Client, token string) int {
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
			if code := post(anonymous, ""); code != http.StatusUnauthorized {
				t.Fatalf("a batch without credentials: %d, want 401", code)
			}
			if tc.secrets == nil {
				var token corev1.Secret
				find(t, objs, "Secret", name+"-token", &token)
				if code := post(anonymous, string(token.Data["token"])); code != http.StatusOK {
					t.Fatalf("a batch with the chart's token: %d, want 200", code)
				}
			} else {
				withCert := tlsClient(t, tlsSecret.Data["ca.crt"])
				withCert.Transport.(*http.Transport).TLSClientConfig.Certificates = []tls.Certificate{clientCert.TLS}
				if code := post(withCert, ""); code != http.StatusOK {
					t.Fatalf("a batch with a client certificate: %d, want 200", code)
				}
			}

			conn := ch.Conn(t, "stampguard")
			query := "SELECT count() FROM events_by_hour WHERE cluster = '" + tc.cluster + "' AND audit_id IN (" + strings.Join(ids, ",") + ")"
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
		})
	}
}

// auditBatch is an EventList of n updates at now, and their audit IDs
// quoted for SQL.
func auditBatch(now time.Time, n int) (string, []string) {
	var events, ids []string
	for i := range n {
		id := fmt.Sprintf("00000000-0000-4000-8000-%012d", (now.UnixNano()/1000)%1e11*10+int64(i))
		ids = append(ids, "'"+id+"'")
		ts := now.Add(time.Duration(i) * time.Millisecond).Format(time.RFC3339Nano)
		events = append(events, `{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"`+id+`","stage":"ResponseComplete",`+
			`"requestURI":"/api/v1/namespaces/shop/configmaps/settings","verb":"update","user":{"username":"alice","groups":["system:authenticated"]},`+
			`"sourceIPs":["10.0.0.1"],"userAgent":"chart-test","objectRef":{"resource":"configmaps","namespace":"shop","name":"settings","apiVersion":"v1"},`+
			`"responseStatus":{"metadata":{},"code":200},"requestReceivedTimestamp":"`+ts+`","stageTimestamp":"`+ts+`"}`)
	}
	return `{"kind":"EventList","apiVersion":"audit.k8s.io/v1","metadata":{},"items":[` + strings.Join(events, ",") + `]}`, ids
}
