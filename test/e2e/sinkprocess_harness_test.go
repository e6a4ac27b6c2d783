package e2e

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stampguard/stampguard/test/pkitest"
)

type sinkProcess struct {
	t    *testing.T
	bin  string
	args []string
	env  []string
	log  string
	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
	err  error // cmd.Wait's, once done is closed
}

func (s *sinkProcess) start() {
	s.t.Helper()
	addr := s.args[2]
	s.launch("listen on "+addr, func() bool {
		c, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true})
		if err == nil {
			c.Close()
		}
		return err == nil
	})
}

// launch starts the process, its output appended to s.log, and returns
// once ready reports true (polled), failing the test if the process exits
// first or is not ready within 30 s.
func (s *sinkProcess) launch(what string, ready func() bool) {
	s.t.Helper()
	s.mu.Lock()
	logf, err := os.OpenFile(s.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		s.mu.Unlock()
		s.t.Fatal(err)
	}
	cmd := exec.Command(s.bin, s.args...)
	cmd.Env, cmd.Stdout, cmd.Stderr = s.env, logf, logf
	if err := cmd.Start(); err != nil {
		s.mu.Unlock()
		s.t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { s.err = cmd.Wait(); logf.Close(); close(done) }()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()
	deadline := time.Now().Add(30 * time.Second)
	for !ready() {
		select {
		case <-done:
			b, _ := os.ReadFile(s.log)
			s.t.Fatalf("auditsink serve exited:\n%s", b)
		default:
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("auditsink serve did not %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// kill sends SIGKILL: no graceful shutdown, no flush.
func (s *sinkProcess) kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	if err := s.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		s.t.Errorf("SIGKILL the sink: %v", err)
	}
	<-s.done
	s.cmd = nil
}

// terminate sends SIGTERM and waits for the exit: how long it took and
// its status (nil for exit 0).
func (s *sinkProcess) terminate() (time.Duration, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	start := time.Now()
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		s.t.Fatalf("SIGTERM the sink: %v", err)
	}
	<-s.done
	s.cmd = nil
	return time.Since(start), s.err
}

// recordingProxy stands between the apiserver and the sink: it forwards
// every batch and keeps its body, so the test can deliver each batch again.
type recordingProxy struct {
	url    string
	target string
	client *http.Client
	mu     sync.Mutex
	kept   [][]byte
}

func newRecordingProxy(t *testing.T, ca *pkitest.CA, serving *pkitest.Cert, target string) *recordingProxy {
	t.Helper()
	p := &recordingProxy{target: target, client: &http.Client{Timeout: 30 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool()}}}}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{serving.TLS}})
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(p.serve)}
	go func() { _ = srv.Serve(ln) }() // ends with ErrServerClosed at cleanup
	t.Cleanup(func() { srv.Close() })
	p.url = "https://" + ln.Addr().String()
	return p
}

func (p *recordingProxy) serve(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	code, answer := p.forward(r.URL.Path, r.Header.Get("Authorization"), body)
	if code == http.StatusOK {
		p.mu.Lock()
		p.kept = append(p.kept, body)
		p.mu.Unlock()
	}
	w.WriteHeader(code)
	_, _ = w.Write(answer)
}

func (p *recordingProxy) forward(path, auth string, body []byte) (int, []byte) {
	req, _ := http.NewRequest(http.MethodPost, p.target+path, bytes.NewReader(body))
	req.Header.Set("Authorization", auth)
	resp, err := p.client.Do(req)
	if err != nil {
		return http.StatusBadGateway, []byte(err.Error())
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

func (p *recordingProxy) bodies() [][]byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slicesClone(p.kept)
}

func (p *recordingProxy) replay(body []byte) (int, []byte) {
	return p.forward("/clusters/webhook/events", "Bearer e2e-token-0123456789abcdef0123456789", body)
}

// sinkWritten is stored + deduplicated events from the sink's metrics.
func sinkWritten(t *testing.T, addr string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		name, value, _ := strings.Cut(sc.Text(), " ")
		if name == "auditsink_events_stored_total" || name == "auditsink_events_deduplicated_total" {
			v, err := strconv.ParseFloat(value, 64)
			if err != nil {
				t.Fatal(err)
			}
			sum += v
		}
	}
	return sum
}

func eventuallyTrue(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func slicesClone(b [][]byte) [][]byte { return append([][]byte(nil), b...) }

func freeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}
