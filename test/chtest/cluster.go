package chtest

import (
	"context"
	"fmt"
	"net"
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

// ClusterName is the name of the cluster in the servers' remote_servers.
const ClusterName = "stampguard"

// zooKeeperClasspath holds Debian's zookeeper package (`make zookeeper`).
const zooKeeperClasspath = "/usr/share/java/*"

// Cluster is a ClickHouse cluster on loopback: ZooKeeper and a grid of
// clickhouse-servers, Shards[shard][replica], that share one remote_servers
// entry (ClusterName, internal_replication on) and the {shard} and {replica}
// macros that Replicated*MergeTree paths use.
type Cluster struct {
	Shards    [][]*Server
	ZooKeeper *ZooKeeper
}

// StartCluster starts ZooKeeper and shards x replicas servers for the rest
// of the test and stops them at cleanup. On 18.16, settings sent with an
// ON CLUSTER query do not reach the other nodes, so the servers' default
// profile allows LowCardinality itself.
func StartCluster(tb testing.TB, shards, replicas int) *Cluster {
	tb.Helper()
	testenv.SkipIfShort(tb, "starts ZooKeeper and a cluster of clickhouse-servers")
	bin, err := exec.LookPath(Binary)
	if err != nil {
		tb.Fatalf("%s not found (%v): run `make clickhouse` to install Debian's clickhouse-server", Binary, err)
	}
	tmpl, err := os.ReadFile(systemConfig)
	if err != nil {
		tb.Fatalf("read %s (%v): run `make clickhouse` to install Debian's clickhouse-server", systemConfig, err)
	}
	root := tb.TempDir()
	zk := StartZooKeeper(tb, filepath.Join(root, "zookeeper"))
	users, err := profileUsers(filepath.Join(root, "users.xml"))
	if err != nil {
		tb.Fatal(err)
	}
	ports := make([][][]int, shards)
	for s := range ports {
		ports[s] = make([][]int, replicas)
		for r := range ports[s] {
			ports[s][r] = freePorts(tb, 3)
		}
	}
	remote := clusterXML(ports)
	c := &Cluster{ZooKeeper: zk, Shards: make([][]*Server, shards)}
	for s := range shards {
		for r := range replicas {
			dir := filepath.Join(root, fmt.Sprintf("s%d-r%d", s+1, r+1))
			extra := "<yandex>\n" + remote +
				"  <zookeeper><node><host>127.0.0.1</host><port>" + strconv.Itoa(zk.Port) + "</port></node></zookeeper>\n" +
				fmt.Sprintf("  <macros><shard>%02d</shard><replica>r%d</replica></macros>\n", s+1, r+1) +
				"</yandex>\n"
			srv := newServer(tb, bin, string(tmpl), dir, ports[s][r], users, extra)
			tb.Cleanup(srv.Stop)
			c.Shards[s] = append(c.Shards[s], srv)
		}
	}
	// Start them together: each waits for its own port only.
	var wg sync.WaitGroup
	for _, shard := range c.Shards {
		for _, srv := range shard {
			wg.Go(srv.Start)
		}
	}
	wg.Wait()
	for _, srv := range c.Servers() {
		if err := srv.awaitDistributedDDL(); err != nil {
			tb.Fatal(err)
		}
		srv.inCluster = true // and after every restart
	}
	return c
}

// awaitDistributedDDL returns once the server has run an ON CLUSTER query
// that it initiated. On 18.16 the distributed DDL worker sets its
// ZooKeeper handle in its own thread after start, and an ON CLUSTER query
// that arrives first dereferences a null handle: the server dies with a
// segmentation fault (zkutil::ZooKeeper::createImpl, seen in CI on a
// loaded machine). A server that died so is started again and asked again;
// nothing was queued, since the crash comes before the task is written.
func (s *Server) awaitDistributedDDL() error {
	deadline := time.Now().Add(90 * time.Second)
	for attempt := 1; ; attempt++ {
		err := s.probeDistributedDDL()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("clickhouse-server on port %d ran no ON CLUSTER query within 90s (%d attempts): %w (logs in %s)", s.Port, attempt, err, s.Dir)
		}
		if s.reapExited() {
			s.tb.Logf("clickhouse-server on port %d died on its first ON CLUSTER query (18.16's startup race); starting it again", s.Port)
			if err := s.start(); err != nil {
				return err
			}
			continue
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// probeDistributedDDL waits until the server talks to ZooKeeper, then
// initiates one harmless ON CLUSTER query on it.
func (s *Server) probeDistributedDDL() error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conn, err := clickhouse.Open(&clickhouse.Options{
		Addr:        []string{fmt.Sprintf("127.0.0.1:%d", s.Port)},
		DialTimeout: 2 * time.Second,
	})
	if err != nil {
		return err
	}
	defer conn.Close()
	var n uint64
	if err := conn.QueryRow(ctx, "SELECT count() FROM system.zookeeper WHERE path = '/'").Scan(&n); err != nil {
		return fmt.Errorf("read ZooKeeper: %w", err)
	}
	return conn.Exec(ctx, "DROP DATABASE IF EXISTS stampguard_ddl_probe ON CLUSTER "+ClusterName)
}

// reapExited reports whether the server process has exited by itself, and
// if so forgets it, so that start runs it again.
func (s *Server) reapExited() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return false
	}
	select {
	case <-s.exited:
		s.cmd = nil
		return true
	default:
		return false
	}
}

// Servers lists every server, shard by shard.
func (c *Cluster) Servers() []*Server {
	var out []*Server
	for _, s := range c.Shards {
		out = append(out, s...)
	}
	return out
}

// DSN names every server, so that the driver fails over between them.
func (c *Cluster) DSN() string {
	var hosts []string
	for _, s := range c.Servers() {
		hosts = append(hosts, "127.0.0.1:"+strconv.Itoa(s.Port))
	}
	return "clickhouse://" + strings.Join(hosts, ",") + "/default?dial_timeout=2s"
}

func clusterXML(ports [][][]int) string {
	var b strings.Builder
	b.WriteString("  <remote_servers>\n    <" + ClusterName + ">\n")
	for _, shard := range ports {
		b.WriteString("      <shard>\n        <internal_replication>true</internal_replication>\n")
		for _, p := range shard {
			fmt.Fprintf(&b, "        <replica><host>127.0.0.1</host><port>%d</port></replica>\n", p[0])
		}
		b.WriteString("      </shard>\n")
	}
	b.WriteString("    </" + ClusterName + ">\n  </remote_servers>\n")
	return b.String()
}

// profileUsers writes a copy of Debian's users.xml whose default profile
// holds what sharded mode needs on 18.16: LowCardinality columns allowed
// (DDL that ON CLUSTER runs on other nodes does not carry the query's
// settings), and the string settings that 18.16's native protocol cannot
// take from a client (store.profileSettings, analytics/store/cluster.go).
func profileUsers(path string) (string, error) {
	b, err := os.ReadFile("/etc/clickhouse-server/users.xml")
	if err != nil {
		return "", fmt.Errorf("read users.xml (run `make clickhouse`): %w", err)
	}
	s := string(b)
	i := strings.Index(s, "<profiles>")
	j := strings.Index(s[i:], "<default>")
	if i < 0 || j < 0 {
		return "", fmt.Errorf("users.xml has no default profile")
	}
	at := i + j + len("<default>")
	s = s[:at] + `
            <allow_experimental_low_cardinality_type>1</allow_experimental_low_cardinality_type>
            <distributed_product_mode>global</distributed_product_mode>` + s[at:]
	// Debian's profile sets load_balancing already (random).
	s = regexp.MustCompile(`<load_balancing>[^<]*</load_balancing>`).ReplaceAllLiteralString(s, "<load_balancing>in_order</load_balancing>")
	if !strings.Contains(s, "<load_balancing>in_order</load_balancing>") {
		s = s[:at] + "\n            <load_balancing>in_order</load_balancing>" + s[at:]
	}
	return path, os.WriteFile(path, []byte(s), 0o644)
}

// ZooKeeper is one standalone ZooKeeper server from Debian's package, run
// without its wrapper scripts.
type ZooKeeper struct {
	Port int
	Dir  string

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
}

// StartZooKeeper runs ZooKeeper on a free loopback port with its data in
// dir, and stops it at cleanup.
func StartZooKeeper(tb testing.TB, dir string) *ZooKeeper {
	tb.Helper()
	java, err := exec.LookPath("java")
	if err != nil {
		tb.Fatalf("java not found (%v): run `make zookeeper`", err)
	}
	if m, _ := filepath.Glob("/usr/share/java/zookeeper-3*.jar"); len(m) == 0 {
		tb.Fatalf("ZooKeeper jars not found in /usr/share/java: run `make zookeeper` to install Debian's zookeeper")
	}
	if err := os.MkdirAll(filepath.Join(dir, "data"), 0o755); err != nil {
		tb.Fatal(err)
	}
	z := &ZooKeeper{Port: freePorts(tb, 1)[0], Dir: dir}
	logf, err := os.Create(filepath.Join(dir, "zookeeper.log"))
	if err != nil {
		tb.Fatal(err)
	}
	cmd := exec.Command(java, "-Xmx256m", "-Dzookeeper.admin.enableServer=false", "-cp", zooKeeperClasspath,
		"org.apache.zookeeper.server.ZooKeeperServerMain", strconv.Itoa(z.Port), filepath.Join(dir, "data"))
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		tb.Fatalf("start ZooKeeper: %v", err)
	}
	z.cmd, z.exited = cmd, make(chan struct{})
	go func() { _ = cmd.Wait(); logf.Close(); close(z.exited) }()
	tb.Cleanup(z.Stop)
	deadline := time.Now().Add(60 * time.Second)
	for !z.answers() {
		select {
		case <-z.exited:
			log, _ := os.ReadFile(filepath.Join(dir, "zookeeper.log"))
			tb.Fatalf("ZooKeeper exited at start:\n%s", tail(log, 4000))
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			tb.Fatalf("ZooKeeper on port %d did not answer within 60s (log in %s)", z.Port, dir)
		}
	}
	return z
}

// answers sends ZooKeeper's "srvr" four-letter command, which a serving
// standalone server answers with its mode.
func (z *ZooKeeper) answers() bool {
	c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(z.Port), time.Second)
	if err != nil {
		return false
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte("srvr")); err != nil {
		return false
	}
	buf := make([]byte, 512)
	n, _ := c.Read(buf)
	return strings.Contains(string(buf[:n]), "Mode:")
}

// Stop ends ZooKeeper.
func (z *ZooKeeper) Stop() {
	z.mu.Lock()
	cmd := z.cmd
	z.cmd = nil
	z.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-z.exited:
	case <-time.After(20 * time.Second):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-z.exited
	}
}

// ClusterConn opens a connection to one server without per-query
// settings: in sharded mode the servers' profile carries what 18.16 needs.
func (s *Server) ClusterConn(tb testing.TB, db string) driver.Conn {
	tb.Helper()
	conn, err := clickhouse.Open(&clickhouse.Options{
		Addr:        []string{fmt.Sprintf("127.0.0.1:%d", s.Port)},
		Auth:        clickhouse.Auth{Database: db},
		DialTimeout: 2 * time.Second,
	})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { conn.Close() })
	return conn
}

// WaitForMutations waits until the server conn talks to has run every
// mutation (ALTER ... DELETE) of database db: ClickHouse runs them in the
// background. It fails the test after two minutes.
func WaitForMutations(tb testing.TB, conn driver.Conn, db string) {
	tb.Helper()
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(50 * time.Millisecond) {
		var running uint64
		if err := conn.QueryRow(context.Background(), "SELECT count() FROM system.mutations WHERE database = ? AND is_done = 0", db).Scan(&running); err != nil {
			tb.Fatalf("count the running mutations of %s: %v", db, err)
		}
		if running == 0 {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("%d mutations of %s still running after two minutes", running, db)
		}
	}
}
