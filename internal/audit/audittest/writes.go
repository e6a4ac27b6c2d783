package audittest

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Writes is n of WriteWrites' events, one line each, for benchmarks that
// repeat them from memory.
func Writes(tb testing.TB, n int) []string {
	path := filepath.Join(tb.TempDir(), "writes.log")
	WriteWrites(tb, path, n)
	data, err := os.ReadFile(path)
	if err != nil {
		tb.Fatal(err)
	}
	return strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
}

// WriteWrites writes to path n RequestResponse write events of 0.9-1.6 KB (the
// ingest benchmark's sizes: analytics/testdata/events.jsonl, 0.5-2 KB):
// creates, then updates of 20,000 configmaps and 2,000 deployments in 200
// namespaces, each carrying the request object and the object as stored;
// one update in 200 without a stamp; about one deployment update in ten
// changes spec.replicas, which its writer does not own. It returns the
// file's size. The replay and suggest benchmarks read it.
func WriteWrites(tb testing.TB, path string, n int) int64 {
	f, err := os.Create(path)
	if err != nil {
		tb.Fatal(err)
	}
	w := bufio.NewWriterSize(f, 1<<20)
	const cms, deps = 20_000, 2_000
	rv := map[int]uint64{}
	next := uint64(1000)
	start := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	var line []byte
	for i := range n {
		next++
		ts := start.Add(time.Duration(i) * 86 * time.Millisecond).Format(time.RFC3339Nano)
		obj := i % (cms + deps)
		old, exists := rv[obj]
		verb, code := "update", 200
		if !exists {
			verb, code = "create", 201
		}
		user := fmt.Sprintf("system:serviceaccount:team-%d:deployer", obj%200)
		stamp := strconv.FormatUint(old, 10)
		if !exists || i%200 == 7 {
			stamp = ""
		}
		ns := fmt.Sprintf("team-%d", obj%200)
		line = line[:0]
		if obj < cms {
			name := fmt.Sprintf("settings-%d", obj)
			body := func(rv string) string {
				rvField := ""
				if rv != "" {
					rvField = `,"resourceVersion":"` + rv + `"`
				}
				return fmt.Sprintf(`{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":%q,"namespace":%q,"uid":"2c9d4a6b-7e1f-4c3a-8b5d-%012d"%s,"creationTimestamp":"2026-11-29T08:00:00Z","labels":{"app":"settings"}},"data":{"mode":"fast","replicas":"%d","endpoint":"https://settings.example.internal:8443/v1"}}`, name, ns, obj, rvField, i%7)
			}
			line = fmt.Appendf(line, `{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"RequestResponse","auditID":"bench-%d","stage":"ResponseComplete","requestURI":"/api/v1/namespaces/%s/configmaps/%s","verb":%q,"user":{"username":%q,"groups":["system:serviceaccounts","system:authenticated"]},"sourceIPs":["10.244.1.17"],"userAgent":"deployer/v1.4.2 (linux/amd64) kubernetes/$Format","objectRef":{"resource":"configmaps","namespace":%q,"name":%q,"apiVersion":"v1","resourceVersion":%q},"responseStatus":{"metadata":{},"code":%d},"requestObject":%s,"responseObject":%s,"requestReceivedTimestamp":%q,"stageTimestamp":%q}`,
				i, ns, name, verb, user, ns, name, stamp, code, body(stamp), body(strconv.FormatUint(next, 10)), ts, ts)
		} else {
			name := fmt.Sprintf("web-%d", obj)
			replicas := 3
			if i%20 == 3 {
				replicas = 4 + i%5 // a writer who does not own it
			}
			body := func(rv string, replicas int) string {
				rvField := ""
				if rv != "" {
					rvField = `,"resourceVersion":"` + rv + `"`
				}
				return fmt.Sprintf(`{"kind":"Deployment","apiVersion":"apps/v1","metadata":{"name":%q,"namespace":%q,"uid":"7a1e9b2c-3d4f-4e5a-8b6c-%012d"%s,"generation":4,"labels":{"app":"web","team":"storefront"}},"spec":{"replicas":%d,"selector":{"matchLabels":{"app":"web"}},"template":{"metadata":{"labels":{"app":"web"}},"spec":{"containers":[{"name":"web","image":"registry.example/web:1.0"}]}}}}`, name, ns, obj, rvField, replicas)
			}
			line = fmt.Appendf(line, `{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"RequestResponse","auditID":"bench-%d","stage":"ResponseComplete","requestURI":"/apis/apps/v1/namespaces/%s/deployments/%s","verb":%q,"user":{"username":%q,"groups":["system:serviceaccounts","system:authenticated"]},"sourceIPs":["10.244.1.17"],"userAgent":"deployer/v1.4.2 (linux/amd64) kubernetes/$Format","objectRef":{"resource":"deployments","namespace":%q,"name":%q,"apiGroup":"apps","apiVersion":"v1","resourceVersion":%q},"responseStatus":{"metadata":{},"code":%d},"requestObject":%s,"responseObject":%s,"requestReceivedTimestamp":%q,"stageTimestamp":%q}`,
				i, ns, name, verb, user, ns, name, stamp, code, body(stamp, replicas), body(strconv.FormatUint(next, 10), replicas), ts, ts)
		}
		line = append(line, '\n')
		if _, err := w.Write(line); err != nil {
			tb.Fatal(err)
		}
		rv[obj] = next
	}
	if err := w.Flush(); err != nil {
		tb.Fatal(err)
	}
	st, _ := f.Stat()
	f.Close()
	return st.Size()
}
