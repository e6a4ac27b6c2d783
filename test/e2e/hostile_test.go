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
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"

	"github.com/stampguard/stampguard/policy/admission"
	"github.com/stampguard/stampguard/test/bintest"
	"github.com/stampguard/stampguard/test/kubetest"
	"github.com/stampguard/stampguard/test/pkitest"
)

// writeAtomic replaces path as a renewal does: a new file renamed over
// the old one.
func writeAtomic(t *testing.T, path string, b []byte) {
	t.Helper()
	tmp := path + ".new"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// servedSerial is the serial number of the certificate addr serves.
func servedSerial(addr string, roots *x509.CertPool) (int64, error) {
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, &tls.Config{RootCAs: roots})
	if err != nil {
		return 0, err
	}
	defer c.Close()
	return c.ConnectionState().PeerCertificates[0].SerialNumber.Int64(), nil
}

// checkTLSFloor: TLS 1.1, and TLS 1.2 with CBC suites only, fail the
// handshake; a client offering h2 gets HTTP/1.1.
func checkTLSFloor(t *testing.T, addr string, roots *x509.CertPool) {
	t.Helper()
	dial := func(cfg *tls.Config) (*tls.Conn, error) {
		cfg.RootCAs = roots
		return tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, cfg)
	}
	if c, err := dial(&tls.Config{MinVersion: tls.VersionTLS10, MaxVersion: tls.VersionTLS11}); err == nil { //nolint:gosec // the point of the test
		c.Close()
		t.Error("a TLS 1.1 handshake succeeded")
	}
	cbc := []uint16{tls.TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA, tls.TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA,
		tls.TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA, tls.TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA}
	if c, err := dial(&tls.Config{MaxVersion: tls.VersionTLS12, CipherSuites: cbc}); err == nil {
		c.Close()
		t.Error("a TLS 1.2 handshake with CBC suites only succeeded")
	}
	c, err := dial(&tls.Config{MaxVersion: tls.VersionTLS12, NextProtos: []string{"h2", "http/1.1"}})
	if err != nil {
		t.Fatalf("a TLS 1.2 handshake with the default (AEAD) suites failed: %v", err)
	}
	defer c.Close()
	if p := c.ConnectionState().NegotiatedProtocol; p == "h2" {
		t.Error("the server negotiated h2")
	}
}

// deploymentReview is an AdmissionReview of alice updating deployment
// shop/web from 3 to 5 replicas, which examples/policies.yaml denies
// (spec.replicas belongs to the HPA), with deep inside the new object.
func deploymentReview(uid, deep string) []byte {
	obj := func(replicas int, extra string) string {
		return `{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"web","namespace":"shop","resourceVersion":"7","labels":{"team":"a"}},"spec":{"replicas":` +
			strconv.Itoa(replicas) + extra + `}}`
	}
	extra := ""
	if deep != "" {
		extra = `,"deep":` + deep
	}
	return []byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"` + uid + `",` +
		`"kind":{"group":"apps","version":"v1","kind":"Deployment"},"resource":{"group":"apps","version":"v1","resource":"deployments"},` +
		`"name":"web","namespace":"shop","operation":"UPDATE","userInfo":{"username":"alice","groups":["system:authenticated"]},` +
		`"object":` + obj(5, extra) + `,"oldObject":` + obj(3, "") + `,"options":{"apiVersion":"meta.k8s.io/v1","kind":"UpdateOptions"}}}`)
}

func postReview(t *testing.T, c *http.Client, url string, body []byte) *admissionv1.AdmissionResponse {
	t.Helper()
	resp, err := c.Post(url, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST %s: HTTP %d %s, want 200 with an answer", url, resp.StatusCode, b)
	}
	var rv admissionv1.AdmissionReview
	if err := json.Unmarshal(b, &rv); err != nil || rv.Response == nil {
		t.Fatalf("not an AdmissionReview answer (%v): %s", err, b)
	}
	return rv.Response
}

// floodBound is what the webhook's RSS may grow by while 24 connections
// each send 2 MiB of a review and stall, and 24 more send headers only,
// with --max-review-bytes 4MiB and --max-review-bytes-in-flight 8MiB: the
// budget, garbage of buffers that doubled, and a few kilobytes per
// connection. Measured: 25-29 MiB on an idle machine, 41 MiB in a
// CI-like run beside the other packages' tests (the collector runs
// later under load, and the garbage is counted); with a budget of 256
// MiB, which does not bind, 91 MiB (the buffers take 24 x 4 MiB: each
// doubles past 2 MiB), and with buffers sized from Content-Length it
// would be as much as soon as the headers arrive. The bound sits between.
const floodBound = 56 << 20

// TestWebhookAgainstHostileClients runs the built webhook in file mode
// (no apiserver is needed to send it reviews) and attacks its admission
// port: a flood of stalled bodies, reviews nested deeper than before and
// deeper than the apiserver allows, old TLS, and, with --client-ca,
// clients without the apiserver's certificate.
func TestWebhookAgainstHostileClients(t *testing.T) {
	webhook := bintest.Build(t, "./cmd/webhook")
	root := kubetest.RepoRoot(t)
	dir := t.TempDir()
	ca := pkitest.NewCA("webhook-ca")
	ca.Server("webhook", "127.0.0.1").WriteFiles(t, dir)
	start := func(extra ...string) (p *process, addr, probes string) {
		addr, probes = freeAddr(t), freeAddr(t)
		host, port, _ := net.SplitHostPort(addr)
		p = startProcess(t, nil, webhook, append([]string{"--policy-file", filepath.Join(root, "examples", "policies.yaml"),
			"--cert-dir", dir, "--host", host, "--port", port, "--probe-addr", probes, "--log-format", "text"}, extra...)...)
		p.waitFor("/readyz answering 200", func() error { return httpStatus(http.DefaultClient, "http://"+probes+"/readyz", http.StatusOK) })
		return p, addr, probes
	}
	p, addr, _ := start("--review-read-timeout", "3s", "--max-review-bytes", strconv.Itoa(4<<20), "--max-review-bytes-in-flight", strconv.Itoa(8<<20))
	client := &http.Client{Timeout: time.Minute, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool()}}}
	fields := "https://" + addr + admission.FieldsPath
	if _, stderr, code := runBinary(t, nil, webhook, "--policy-file", filepath.Join(root, "examples", "policies.yaml"), "--max-review-bytes-in-flight", "1000"); code != 2 || !strings.Contains(stderr, "--max-review-bytes-in-flight") {
		t.Errorf("a budget below two reviews: exit %d, stderr %q; want 2 naming the flag", code, stderr)
	}

	t.Run("a flood of stalled bodies is cut at the read deadline, denied, closed, and the RSS stays bounded", func(t *testing.T) {
		before := rssBytes(t, p.cmd.Process.Pid)
		type answer struct {
			head   string // status line and body
			closed bool   // the server closed the connection after it
			err    error
		}
		const n = 24
		answers := make(chan answer, 2*n)
		var wg sync.WaitGroup
		stall := func(i int, body []byte) {
			defer wg.Done()
			conn, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: ca.Pool()})
			if err != nil {
				answers <- answer{err: err}
				return
			}
			defer conn.Close()
			go func() { // the server stops reading when the budget is spent
				_, _ = fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", admission.FieldsPath, addr, 4<<20-1)
				_, _ = conn.Write(body)
			}()
			_ = conn.SetReadDeadline(time.Now().Add(time.Minute))
			r := bufio.NewReader(conn)
			resp, err := http.ReadResponse(r, nil)
			if err != nil {
				answers <- answer{err: fmt.Errorf("connection %d: %w", i, err)}
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			_, err = r.ReadByte() // the server must close the connection
			answers <- answer{head: resp.Status + " " + string(b), closed: errors.Is(err, io.EOF)}
		}
		for i := range n {
			wg.Add(2)
			prefix := `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"flood-` + strconv.Itoa(i) + `","pad":"`
			go stall(i, append([]byte(prefix), bytes.Repeat([]byte("x"), 2<<20)...))
			go stall(n+i, nil) // headers only
		}
		peak := before
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		for waiting := true; waiting; {
			select {
			case <-done:
				waiting = false
			case <-time.After(50 * time.Millisecond):
				peak = max(peak, rssBytes(t, p.cmd.Process.Pid))
			}
		}
		close(answers)
		denied, timedOut := 0, 0
		for a := range answers {
			switch {
			case a.err != nil:
				t.Error(a.err)
			case !a.closed:
				t.Errorf("the connection stayed open after %q", a.head)
			case strings.HasPrefix(a.head, "200 ") && strings.Contains(a.head, `"allowed":false`):
				denied++ // named its uid: denied with the reason
			case strings.HasPrefix(a.head, "408 "):
				timedOut++ // no uid to answer
			default:
				t.Errorf("answer %.300q, want a denial or a 408", a.head)
			}
		}
		t.Logf("RSS %d MiB before, peak %d MiB during %d stalled connections; %d denied, %d answered 408, all closed",
			before>>20, peak>>20, 2*n, denied, timedOut)
		if denied != n || timedOut != n {
			t.Errorf("%d denials and %d 408s, want %d of each", denied, timedOut, n)
		}
		if peak-before > floodBound {
			t.Errorf("RSS grew by %d MiB (from %d to %d MiB), more than %d MiB", (peak-before)>>20, before>>20, peak>>20, floodBound>>20)
		}
		if resp := postReview(t, client, fields, deploymentReview("after-flood", "")); resp.Allowed {
			t.Errorf("after the flood, a review the policy denies was allowed: %+v", resp)
		}
	})

	t.Run("a review nested 600 deep is evaluated and denied by its policy", func(t *testing.T) {
		resp := postReview(t, client, fields, deploymentReview("deep-600", strings.Repeat("[", 600)+strings.Repeat("]", 600)))
		if resp.Allowed || resp.UID != "deep-600" || resp.Result == nil || !strings.Contains(resp.Result.Message, "spec.replicas") {
			t.Fatalf("got %+v, want the policy's denial of the replicas change", resp)
		}
	})
	t.Run("a review nested deeper than the apiserver allows is denied by name, not left to failurePolicy", func(t *testing.T) {
		resp := postReview(t, client, fields, deploymentReview("deep-10001", strings.Repeat("[", 10001)+strings.Repeat("]", 10001)))
		if resp.Allowed || resp.UID != "deep-10001" || resp.Result == nil || !strings.Contains(resp.Result.Message, "nesting too deep") {
			t.Fatalf("got %+v, want a denial saying the nesting is too deep", resp)
		}
	})
	t.Run("TLS 1.1 and CBC suites are refused, h2 is not negotiated", func(t *testing.T) {
		checkTLSFloor(t, addr, ca.Pool())
	})
	if code := p.stop(); code != 0 {
		t.Fatalf("exit code %d after SIGTERM; output:\n%s", code, p.out.String())
	}

	t.Run("with --client-ca, only a client with a certificate of that CA is answered", func(t *testing.T) {
		clientCA := pkitest.NewCA("apiserver-client-ca")
		p, addr, _ := start("--client-ca", clientCA.WriteFile(t, t.TempDir()))
		url := "https://" + addr + admission.FieldsPath
		apiserver, stranger := clientCA.Client("kube-apiserver"), pkitest.NewCA("other").Client("kube-apiserver")
		with := func(cert *pkitest.Cert) *http.Client {
			return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: ca.ClientConfig(cert)}}
		}
		for what, c := range map[string]*http.Client{"no certificate": with(nil), "a certificate of another CA": with(stranger)} {
			if resp, err := c.Post(url, "application/json", bytes.NewReader(deploymentReview("x", ""))); err == nil {
				resp.Body.Close()
				t.Errorf("a client with %s got HTTP %d, want a refused handshake", what, resp.StatusCode)
			}
		}
		if resp := postReview(t, with(apiserver), url, deploymentReview("with-cert", "")); resp.Allowed || resp.UID != "with-cert" {
			t.Errorf("the apiserver's certificate: got %+v, want the policy's denial", resp)
		}
		if code := p.stop(); code != 0 {
			t.Fatalf("exit code %d after SIGTERM; output:\n%s", code, p.out.String())
		}
	})
}

// sinkToken is at least config.MinTokenLength characters.
const sinkToken = "hostile-token-0123456789abcdef0123456789"

// TestAuditsinkAgainstHostileClients runs the built sink with client
// certificates and a token, each bound to a cluster, and a ClickHouse it
// never reaches (the spool takes the batches): foreign names and other
// clusters are refused, the serving certificate and the client CA are
// renewed on disk and used within seconds, and the TLS floor holds.
func TestAuditsinkAgainstHostileClients(t *testing.T) {
	bin := bintest.Build(t, "./cmd/auditsink")
	dir := t.TempDir()
	serverCA, clientCA := pkitest.NewCA("sink-ca"), pkitest.NewCA("apiserver-client-ca")
	first := serverCA.Server("auditsink", "127.0.0.1")
	certFile, keyFile := first.WriteFiles(t, dir)
	caFile := clientCA.WriteFile(t, dir)
	addr := freeAddr(t)
	// The token comes from the environment with a trailing newline, as
	// `kubectl create secret --from-file` and editors leave it.
	env := append(os.Environ(), "AUDITSINK_TOKEN="+sinkToken+"\n", "AUDITSINK_CLICKHOUSE_DSN=clickhouse://127.0.0.1:1?dial_timeout=200ms")
	p := startProcess(t, env, bin, "serve", "--listen", addr, "--tls-cert", certFile, "--tls-key", keyFile,
		"--client-ca", caFile, "--client-names", "apiserver-prod=prod,apiserver-shared", "--token-clusters", "dev",
		"--spool-dir", filepath.Join(dir, "spool"), "--metrics-listen", "127.0.0.1:0")
	p.waitFor("the sink serving TLS", func() error { _, err := servedSerial(addr, serverCA.Pool()); return err })

	prod, shared, node := clientCA.Client("apiserver-prod"), clientCA.Client("apiserver-shared"), clientCA.Client("system:node:evil")
	post := func(cert *pkitest.Cert, token, cluster string) (int, string) {
		t.Helper()
		c := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: serverCA.ClientConfig(cert)}}
		req, _ := http.NewRequest(http.MethodPost, "https://"+addr+"/clusters/"+cluster+"/events",
			strings.NewReader(`{"kind":"EventList","apiVersion":"audit.k8s.io/v1","items":[]}`))
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("POST to cluster %s: %v", cluster, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, c := range []struct {
		what    string
		cert    *pkitest.Cert
		token   string
		cluster string
		code    int
	}{
		{"a certificate bound to prod writes prod", prod, "", "prod", 200},
		{"a certificate bound to prod may not write dev", prod, "", "dev", 403},
		{"an unbound name writes any cluster", shared, "", "dev", 200},
		{"a certificate of the client CA with a foreign name (a kubelet's) is refused", node, "", "prod", 403},
		{"the token (from the environment, trimmed) writes its cluster dev", nil, sinkToken, "dev", 200},
		{"the token may not write prod", nil, sinkToken, "prod", 403},
		{"a foreign name with the token writes the token's cluster", node, sinkToken, "dev", 200},
		{"no credential", nil, "", "dev", 401},
	} {
		if code, body := post(c.cert, c.token, c.cluster); code != c.code {
			t.Errorf("%s: HTTP %d %s, want %d", c.what, code, body, c.code)
		}
	}
	if out := p.out.String(); !strings.Contains(out, `is not on the allow-list of names`) || !strings.Contains(out, `may not write cluster \"dev\"`) {
		t.Errorf("the log does not say why batches were refused:\n%s", out)
	}

	t.Run("TLS 1.1 and CBC suites are refused, h2 is not negotiated", func(t *testing.T) {
		checkTLSFloor(t, addr, serverCA.Pool())
	})
	t.Run("a certificate renewed on disk is served within seconds", func(t *testing.T) {
		next := serverCA.Server("auditsink", "127.0.0.1")
		if s, err := servedSerial(addr, serverCA.Pool()); err != nil || s != first.Serial() {
			t.Fatalf("serial %d (%v) before the renewal, want %d", s, err, first.Serial())
		}
		renewed := time.Now()
		writeAtomic(t, keyFile, next.KeyPEM)
		writeAtomic(t, certFile, next.CertPEM)
		p.waitFor("the renewed certificate served", func() error {
			if s, err := servedSerial(addr, serverCA.Pool()); err != nil || s != next.Serial() {
				return fmt.Errorf("serial %d (%w), want %d", s, err, next.Serial())
			}
			return nil
		})
		t.Logf("the renewed certificate was served %s after it was written", time.Since(renewed).Round(100*time.Millisecond))
	})
	t.Run("a client CA renewed on disk verifies its certificates within seconds", func(t *testing.T) {
		next := pkitest.NewCA("apiserver-client-ca-2")
		renewedProd := next.Client("apiserver-prod")
		if code, _ := post(renewedProd, "", "prod"); code != 401 {
			t.Fatalf("a certificate of the next CA before the renewal: %d, want 401", code)
		}
		writeAtomic(t, caFile, append(append([]byte{}, clientCA.PEM...), next.PEM...)) // a rotation: both CAs
		p.waitFor("the next CA's certificate accepted", func() error {
			if code, body := post(renewedProd, "", "prod"); code != 200 {
				return fmt.Errorf("HTTP %d %s", code, body)
			}
			return nil
		})
		if code, _ := post(node, "", "prod"); code != 403 {
			t.Errorf("after the renewal, the foreign name: %d, want 403", code)
		}
	})
	if code := p.stop(); code != 0 {
		t.Fatalf("exit code %d after SIGTERM; output:\n%s", code, p.out.String())
	}

	t.Run("weak or contradictory credentials are usage errors that name the flag", func(t *testing.T) {
		base := []string{"serve", "--clickhouse", "clickhouse://127.0.0.1:1", "--plaintext", "--spool-dir", filepath.Join(dir, "spool2")}
		for _, c := range []struct {
			env  []string
			args []string
			flag string
		}{
			{[]string{"AUDITSINK_TOKEN=short"}, nil, "$AUDITSINK_TOKEN"},
			{[]string{"AUDITSINK_TOKEN=" + sinkToken}, []string{"--allow-unauthenticated"}, "--allow-unauthenticated"},
			{[]string{"AUDITSINK_TOKEN=" + sinkToken}, []string{"--no-migrate", "--retention", "30d"}, "--retention"},
		} {
			_, stderr, code := runBinary(t, append(os.Environ(), c.env...), bin, append(base, c.args...)...)
			if code != 2 || !strings.Contains(stderr, c.flag+": ") {
				t.Errorf("%v %v: exit %d, stderr %q; want 2 naming %s", c.env, c.args, code, stderr, c.flag)
			}
		}
	})
}
