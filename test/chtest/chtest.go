// Package chtest starts a real clickhouse-server for tests: Debian's binary
// on free loopback ports, with its own data directory under t.TempDir(), and
// stops it at test cleanup.
package chtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/stampguard/stampguard/test/testenv"
)

// Binary is the server binary the harness runs; `make clickhouse` installs it.
const Binary = "clickhouse-server"

// systemConfig is Debian's config that the harness copies and rewrites.
const systemConfig = "/etc/clickhouse-server/config.xml"

// Server is one clickhouse-server process owned by a test.
type Server struct {
	// Port is the native protocol port on 127.0.0.1.
	Port int
	// HTTPPort is the HTTP interface's port on 127.0.0.1 (QueryText).
	HTTPPort int
	// Dir holds the config, data, tmp and log directories.
	Dir string

	tb     testing.TB
	config string
	bin    string
	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
	// inCluster: Start also waits until the server runs ON CLUSTER
	// queries (awaitDistributedDDL).
	inCluster bool
}

// Start runs a fresh server and registers its stop with tb.Cleanup. A missing
// binary fails the test with the make target that installs it. Under -short
// it skips the test (testenv.SkipIfShort), as kubetest.Start does.
func Start(tb testing.TB) *Server {
	tb.Helper()
	return StartWithUsers(tb, "")
}

// StartWithUsers is Start with users (a users.xml file) in place of
// Debian's: for tests of ClickHouse users and their rights.
func StartWithUsers(tb testing.TB, users string) *Server {
	tb.Helper()
	return start(tb, users, "")
}

// timeZoneName is an IANA zone name as tzdata spells it.
var timeZoneName = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_+-]*(/[A-Za-z0-9_+-]+)*$`)

// StartInTimeZone is Start with the server's time zone set to tz (an IANA
// name such as America/New_York) in config.d: toDate, toDateTime and
// today() without a zone argument then compute in tz, as they do on a
// server deployed outside UTC.
func StartInTimeZone(tb testing.TB, tz string) *Server {
	tb.Helper()
	if !timeZoneName.MatchString(tz) {
		tb.Fatalf("time zone %q: want an IANA name such as America/New_York", tz)
	}
	if _, err := time.LoadLocation(tz); err != nil {
		tb.Fatalf("time zone %q: %v", tz, err)
	}
	return start(tb, "", "<yandex>\n\t<timezone>"+tz+"</timezone>\n</yandex>\n")
}

func start(tb testing.TB, users, extra string) *Server {
	tb.Helper()
	testenv.SkipIfShort(tb, "starts a real clickhouse-server")
	bin, err := exec.LookPath(Binary)
	if err != nil {
		tb.Fatalf("%s not found (%v): run `make clickhouse` to install Debian's clickhouse-server", Binary, err)
	}
	tmpl, err := os.ReadFile(systemConfig)
	if err != nil {
		tb.Fatalf("read %s (%v): run `make clickhouse` to install Debian's clickhouse-server", systemConfig, err)
	}
	s := newServer(tb, bin, string(tmpl), tb.TempDir(), freePorts(tb, 3), users, extra)
	tb.Cleanup(s.Stop)
	s.Start()
	return s
}

// newServer writes a server's config into dir, with ports (native, HTTP,
// interserver), the users file (Debian's when empty) and, when extra is
// set, a config.d/stampguard.xml merged over Debian's config.
func newServer(tb testing.TB, bin, tmpl, dir string, ports []int, users, extra string) *Server {
	tb.Helper()
	s, err := writeServer(bin, tmpl, dir, ports, users, extra)
	if err != nil {
		tb.Fatal(err)
	}
	s.tb = tb
	tb.Cleanup(func() {
		if tb.Failed() {
			log, _ := os.ReadFile(filepath.Join(dir, "log", "clickhouse-server.err.log"))
			tb.Logf("clickhouse-server on port %d, the end of its error log:\n%s", s.Port, tail(log, 3000))
		}
	})
	return s
}

func writeServer(bin, tmpl, dir string, ports []int, users, extra string) (*Server, error) {
	if users == "" {
		users = "/etc/clickhouse-server/users.xml"
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	cfg := rewriteConfig(tmpl, dir, ports, users)
	path := filepath.Join(dir, "config.xml")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		return nil, err
	}
	if extra != "" {
		if err := os.MkdirAll(filepath.Join(dir, "config.d"), 0o755); err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(dir, "config.d", "stampguard.xml"), []byte(extra), 0o644); err != nil {
			return nil, err
		}
	}
	return &Server{Port: ports[0], HTTPPort: ports[1], Dir: dir, config: path, bin: bin}, nil
}

// StartServer runs a server outside a test (the demo): its config, data
// and logs in dir, on free loopback ports. It returns once the server
// answers; the error names what failed (binary missing, a port taken, the
// server exiting at start). Stop ends it; the Start method is for servers
// of the Start function only.
func StartServer(dir string) (*Server, error) {
	bin, err := exec.LookPath(Binary)
	if err != nil {
		return nil, fmt.Errorf("%s not found (%w): run `make clickhouse` to install Debian's clickhouse-server", Binary, err)
	}
	tmpl, err := os.ReadFile(systemConfig)
	if err != nil {
		return nil, fmt.Errorf("read %s (%w): run `make clickhouse` to install Debian's clickhouse-server", systemConfig, err)
	}
	ports, err := pickFreePorts(3)
	if err != nil {
		return nil, err
	}
	s, err := writeServer(bin, string(tmpl), dir, ports, "", "")
	if err != nil {
		return nil, err
	}
	if err := s.start(); err != nil {
		s.Stop()
		return nil, err
	}
	return s, nil
}

// DSN is the clickhouse-go DSN of the server's default database.
func (s *Server) DSN() string {
	return fmt.Sprintf("clickhouse://127.0.0.1:%d/default?dial_timeout=2s", s.Port)
}

// DatabaseDSN is the DSN of database db on this server.
func (s *Server) DatabaseDSN(db string) string {
	return fmt.Sprintf("clickhouse://127.0.0.1:%d/%s?dial_timeout=2s", s.Port, db)
}

// Start (re)starts the server process and waits until it answers. It is a
// no-op while the server runs.
func (s *Server) Start() {
	s.tb.Helper()
	if err := s.start(); err != nil {
		s.tb.Fatal(err)
	}
	if s.inCluster {
		if err := s.awaitDistributedDDL(); err != nil {
			s.tb.Fatal(err)
		}
	}
}

// start runs the server and waits until it answers. A server that runs
// but has not answered within 60 s is killed and started again, twice at
// most: on a loaded machine 18.16 has been seen to accept connections and
// never answer them (CI, TestClusterMode), its error log empty.
func (s *Server) start() error {
	var err error
	for attempt := 1; attempt <= 3; attempt++ {
		if err = s.startOnce(); !errors.Is(err, errNoAnswer) {
			return err
		}
		s.Kill()
		if s.tb != nil {
			out, _ := os.ReadFile(filepath.Join(s.Dir, "log", "clickhouse-server.log"))
			s.tb.Logf("%v; killed it (attempt %d of 3), the end of its log:\n%s", err, attempt, tail(out, 2000))
		}
	}
	return err
}

// errNoAnswer is wrapped by startOnce's error when the server ran but did
// not answer.
var errNoAnswer = errors.New("did not answer")

func (s *Server) startOnce() error {
	s.mu.Lock()
	if s.cmd != nil {
		s.mu.Unlock()
		return nil
	}
	cmd := exec.Command(s.bin, "--config-file="+s.config)
	cmd.Dir = s.Dir
	logf, err := os.OpenFile(filepath.Join(s.Dir, "stdout.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		s.mu.Unlock()
		return err
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		s.mu.Unlock()
		return fmt.Errorf("start %s: %w", Binary, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); logf.Close(); close(exited) }()
	s.cmd, s.exited = cmd, exited
	s.mu.Unlock()

	deadline := time.Now().Add(60 * time.Second)
	for {
		if err := s.ping(); err == nil {
			return nil
		} else if time.Now().After(deadline) {
			return fmt.Errorf("clickhouse-server on port %d %w within 60s: %w (logs in %s)", s.Port, errNoAnswer, err, s.Dir)
		}
		select {
		case <-exited:
			log, _ := os.ReadFile(filepath.Join(s.Dir, "log", "clickhouse-server.err.log"))
			if bytes.Contains(log, []byte("Address already in use")) {
				return fmt.Errorf("clickhouse-server exited at start: one of its ports (%d native, %d HTTP) is taken; err log:\n%s", s.Port, s.HTTPPort, tail(log, 2000))
			}
			return fmt.Errorf("clickhouse-server exited at start; err log:\n%s", tail(log, 4000))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Stop terminates the server and waits for it to exit. Data stays on disk, so
// Start brings the same databases back.
func (s *Server) Stop() {
	cmd, exited := s.take()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(20 * time.Second):
		_ = cmd.Process.Kill()
		<-exited
	}
}

// Kill sends SIGKILL to the server, as an OOM kill does: no shutdown, an
// insert in flight cut wherever it is. Data stays on disk; Start brings the
// server back.
func (s *Server) Kill() {
	cmd, exited := s.take()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	<-exited
}

// take hands the running process (nil if none) to a caller that ends it.
func (s *Server) take() (*exec.Cmd, chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	cmd, exited := s.cmd, s.exited
	s.cmd = nil
	return cmd, exited
}

// PID is the server's process id (0 while stopped), for measuring its CPU
// and memory in benchmarks.
func (s *Server) PID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// Conn opens a native connection to db with
// allow_experimental_low_cardinality_type = 1, which LowCardinality DDL
// needs on 18.x: the harness always runs Debian's 18.16 (the product picks
// its settings by server version, analytics' settingsFor).
func (s *Server) Conn(tb testing.TB, db string) driver.Conn {
	tb.Helper()
	conn, err := clickhouse.Open(&clickhouse.Options{
		Addr:        []string{fmt.Sprintf("127.0.0.1:%d", s.Port)},
		Auth:        clickhouse.Auth{Database: db},
		Settings:    clickhouse.Settings{"allow_experimental_low_cardinality_type": 1},
		DialTimeout: 2 * time.Second,
	})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { conn.Close() })
	return conn
}

// QueryText runs one statement over the HTTP interface and returns the
// server's answer in format (for SELECTs; TabSeparated when empty). A text
// answer is what another engine's answer can be compared with byte for
// byte. Statements of one session share temporary tables. Other settings
// (such as allow_experimental_low_cardinality_type) are not sent.
func (s *Server) QueryText(tb testing.TB, session, sql, format string) (string, error) {
	tb.Helper()
	q := url.Values{}
	if session != "" {
		q.Set("session_id", session)
	}
	if format != "" {
		sql += "\nFORMAT " + format
	}
	u := fmt.Sprintf("http://127.0.0.1:%d/?%s", s.HTTPPort, q.Encode())
	req, err := http.NewRequestWithContext(tb.Context(), http.MethodPost, u, strings.NewReader(sql))
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("ClickHouse 18.16: %s", strings.TrimSpace(string(body)))
	}
	return string(body), nil
}

// NewDatabase creates a database with a fresh random name and returns it.
func (s *Server) NewDatabase(tb testing.TB) string {
	tb.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "t_" + hex.EncodeToString(b[:])
	conn := s.Conn(tb, "default")
	if err := conn.Exec(tb.Context(), "CREATE DATABASE "+name); err != nil {
		tb.Fatalf("create database %s: %v", name, err)
	}
	return name
}

func (s *Server) ping() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	conn, err := clickhouse.Open(&clickhouse.Options{
		Addr:        []string{fmt.Sprintf("127.0.0.1:%d", s.Port)},
		DialTimeout: time.Second,
	})
	if err != nil {
		return err
	}
	defer conn.Close()
	return conn.Ping(ctx)
}

var (
	reTag = func(tag string) *regexp.Regexp {
		return regexp.MustCompile(`<` + tag + `>[^<]*</` + tag + `>`)
	}
	reLogger = regexp.MustCompile(`(?s)<logger>.*?</logger>`)
)

// rewriteConfig points ports and paths of Debian's config at dir.
func rewriteConfig(cfg, dir string, ports []int, users string) string {
	set := func(tag, val string) {
		cfg = reTag(tag).ReplaceAllLiteralString(cfg, "<"+tag+">"+val+"</"+tag+">")
	}
	set("tcp_port", strconv.Itoa(ports[0]))
	set("http_port", strconv.Itoa(ports[1]))
	set("interserver_http_port", strconv.Itoa(ports[2]))
	set("interserver_http_host", "127.0.0.1")
	set("tmp_path", dir+"/tmp/")
	set("user_files_path", dir+"/user_files/")
	set("format_schema_path", dir+"/format_schemas/")
	set("users_config", users)
	// <path> also appears inside <distributed_ddl> (a ZooKeeper path): only
	// the data path, the first one, is a directory.
	re := reTag("path")
	done := false
	cfg = re.ReplaceAllStringFunc(cfg, func(m string) string {
		if done {
			return m
		}
		done = true
		return "<path>" + dir + "/data/</path>"
	})
	cfg = reLogger.ReplaceAllLiteralString(cfg, "<logger><level>warning</level><log>"+dir+
		"/log/clickhouse-server.log</log><errorlog>"+dir+"/log/clickhouse-server.err.log</errorlog></logger>")
	return cfg
}

func freePorts(tb testing.TB, n int) []int {
	tb.Helper()
	ports, err := pickFreePorts(n)
	if err != nil {
		tb.Fatal(err)
	}
	return ports
}

// pickFreePorts asks the kernel for n distinct free loopback ports.
func pickFreePorts(n int) ([]int, error) {
	// Below the kernel's ephemeral range: a port that a stopped server
	// gives up is then never handed to another process's connect or
	// listen on port 0 before the server starts again on it (tests stop
	// and restart servers on their ports).
	low, high := 10000, ephemeralLow()
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for tries := 0; len(ports) < n; tries++ {
		if tries > 1000 {
			return nil, fmt.Errorf("pick a free port: none free in %d-%d", low, high-1)
		}
		p := low + mrand.IntN(high-low)
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			continue
		}
		if l6, err := net.Listen("tcp", fmt.Sprintf("[::1]:%d", p)); err == nil {
			ls = append(ls, l6)
		} else if errors.Is(err, syscall.EADDRINUSE) {
			l.Close()
			continue
		}
		ls = append(ls, l)
		ports = append(ports, p)
	}
	return ports, nil
}

// ephemeralLow is the first port of the kernel's ephemeral range (32768
// when it cannot be read).
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	var lo, hi int
	if _, err := fmt.Sscan(string(b), &lo, &hi); err != nil || lo <= 10000+1000 {
		return 32768
	}
	return lo
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}
