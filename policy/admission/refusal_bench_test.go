package admission

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"

	"github.com/stampguard/stampguard/internal/cli"
	"github.com/stampguard/stampguard/policy"
	"github.com/stampguard/stampguard/test/pkitest"
)

// refusalPolicies guard ConfigMaps in "shop" as the e2e latency benchmark's
// policy does: a stamp is required and the label "team" is immutable.
const refusalPolicies = `apiVersion: stampguard.dev/v1alpha1
kind: ConcurrencyPolicy
metadata: {name: bench}
spec:
  match: {resources: [{resource: configmaps}]}
  fieldOwners: [{path: 'data["owned"]', writers: {users: [owner]}}]
  immutableFields: [{path: 'metadata.labels["team"]'}]
  requireResourceVersion: true
`

// configMapReview is an UPDATE of a small ConfigMap as the apiserver sends
// it (managed fields, options, dry run), by alice, who either leaves the
// resourceVersion out (stampless) or changes the immutable label.
func configMapReview(t testing.TB, stampless bool) []byte {
	t.Helper()
	cm := func(rv, team, free string) runtime.RawExtension {
		o := &corev1.ConfigMap{
			TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
			ObjectMeta: metav1.ObjectMeta{
				Name: "cm", Namespace: "shop", UID: "7b0e4a52-3c55-4b8e-a1d4-5f0f6c7d8e9a", ResourceVersion: rv,
				CreationTimestamp: metav1.NewTime(time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)),
				Labels:            map[string]string{"team": team},
				ManagedFields: []metav1.ManagedFieldsEntry{{
					Manager: "e2e.test", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1", FieldsType: "FieldsV1",
					Time:     ptr.To(metav1.NewTime(time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC))),
					FieldsV1: metav1.NewFieldsV1(`{"f:data":{".":{},"f:free":{},"f:owned":{}},"f:metadata":{"f:labels":{".":{},"f:team":{}}}}`),
				}},
			},
			Data: map[string]string{"owned": "1", "free": free},
		}
		b, err := json.Marshal(o)
		if err != nil {
			t.Fatal(err)
		}
		return runtime.RawExtension{Raw: b}
	}
	obj := cm("1234", "b", "0")
	if stampless {
		obj = cm("", "a", "1")
	}
	rv := admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID:         "0c9e4b8e-7f2f-4d7c-9d7a-1f2e3d4c5b6a",
			Kind:        metav1.GroupVersionKind{Version: "v1", Kind: "ConfigMap"},
			Resource:    metav1.GroupVersionResource{Version: "v1", Resource: "configmaps"},
			RequestKind: &metav1.GroupVersionKind{Version: "v1", Kind: "ConfigMap"}, RequestResource: &metav1.GroupVersionResource{Version: "v1", Resource: "configmaps"},
			Name: "cm", Namespace: "shop", Operation: admissionv1.Update,
			UserInfo: authenticationv1.UserInfo{Username: "alice", Groups: []string{"system:authenticated"}},
			Object:   obj, OldObject: cm("1234", "a", "0"),
			Options: runtime.RawExtension{Raw: []byte(`{"kind":"UpdateOptions","apiVersion":"meta.k8s.io/v1","dryRun":["All"],"fieldManager":"e2e.test"}`)},
			DryRun:  ptr.To(true),
		},
	}
	b, err := json.Marshal(rv)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// BenchmarkRefusalOverHTTPS is the webhook's TLS review server (Server,
// as the process runs it, with JSON logs at info to /dev/null as a process
// writes them to its stderr) serving refusals: a stampless ConfigMap update on
// the mutating endpoint and a change of an immutable label on the
// validating one, from a client that keeps its connection (as the
// apiserver's does) and from one that dials each time (a full handshake
// per call). Profile it with -cpuprofile.
func BenchmarkRefusalOverHTTPS(b *testing.B) {
	dir := b.TempDir()
	pkitest.NewCA("test-ca").Server("stampguard-test", "127.0.0.1").WriteFiles(b, dir)
	set, err := policy.Load(strings.NewReader(refusalPolicies))
	if err != nil {
		b.Fatal(err)
	}
	port := freePort(b)
	srv, err := NewServer(ServerOptions{Host: "127.0.0.1", Port: port, CertDir: dir, Logger: devNullLogger(b)})
	if err != nil {
		b.Fatal(err)
	}
	srv.Answer(NewStaticSource(policy.NewSet(set...)), &policy.Environment{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Start(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			b.Error(err)
		}
	}()
	for deadline := time.Now().Add(30 * time.Second); srv.StartedChecker()(nil) != nil; time.Sleep(10 * time.Millisecond) {
		select {
		case err := <-done:
			b.Fatal(err)
		default:
		}
		if time.Now().After(deadline) {
			b.Fatal("not serving after 30s")
		}
	}
	base := "https://127.0.0.1:" + strconv.Itoa(port)
	for _, c := range []struct {
		name, path, want string
		stampless        bool
	}{
		{"stampless", StampPath, `"code":422`, true},
		{"immutable", FieldsPath, `"code":422`, false},
	} {
		body := configMapReview(b, c.stampless)
		for _, keepAlive := range []bool{true, false} {
			name := c.name + "/keep-alive"
			if !keepAlive {
				name = c.name + "/dial-per-call"
			}
			b.Run(name, func(b *testing.B) {
				tr := &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, DisableKeepAlives: !keepAlive} //nolint:gosec // a test certificate
				defer tr.CloseIdleConnections()
				client := &http.Client{Transport: tr}
				b.ReportAllocs()
				b.SetBytes(int64(len(body)))
				for b.Loop() {
					resp, err := client.Post(base+c.path, "application/json", bytes.NewReader(body))
					if err != nil {
						b.Fatal(err)
					}
					answer, err := io.ReadAll(resp.Body)
					resp.Body.Close()
					if err != nil || !strings.Contains(string(answer), `"allowed":false`) || !strings.Contains(string(answer), c.want) {
						b.Fatalf("answer %s, %v", answer, err)
					}
				}
			})
		}
	}
}

// BenchmarkRefusalDecision is the decision alone for the refusals of
// BenchmarkRefusalOverHTTPS: the mounted handler on the same reviews,
// without TLS or HTTP (read, decode, evaluate, answer, count, log).
func BenchmarkRefusalDecision(b *testing.B) {
	set, err := policy.Load(strings.NewReader(refusalPolicies))
	if err != nil {
		b.Fatal(err)
	}
	log := devNullLogger(b)
	stamp, fields := Handlers(NewStaticSource(policy.NewSet(set...)), &policy.Environment{}, NewMetrics(nil), log, 0)
	for _, c := range []struct {
		name      string
		h         http.Handler
		stampless bool
	}{{"stampless", stamp, true}, {"immutable", fields, false}} {
		b.Run(c.name, func(b *testing.B) {
			body := configMapReview(b, c.stampless)
			req, _ := http.NewRequest(http.MethodPost, "/", nil)
			w := &discardWriter{h: http.Header{}}
			rd := bytes.NewReader(body)
			b.ReportAllocs()
			for b.Loop() {
				rd.Reset(body)
				req.Body = io.NopCloser(rd)
				c.h.ServeHTTP(w, req)
			}
		})
	}
}

// freePort is a free loopback port for the server benchmarked here.
func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// devNullLogger is the webhook's default logger (JSON, info) writing to
// /dev/null, so that a logged line costs its write as on a process's stderr.
func devNullLogger(b *testing.B) *slog.Logger {
	devNull, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { devNull.Close() })
	log, err := cli.NewLogger(devNull, "info", "json")
	if err != nil {
		b.Fatal(err)
	}
	return log
}
