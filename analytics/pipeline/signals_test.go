package pipeline

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/stampguard/stampguard/analytics/sql"
	"github.com/stampguard/stampguard/internal/audit"
	"github.com/stampguard/stampguard/internal/audit/audittest"
	"github.com/stampguard/stampguard/test/chdbtest"
	"github.com/stampguard/stampguard/test/testenv"
)

// sqlString quotes s for ClickHouse (both engines honour backslash
// escapes).
func sqlString(s string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(s) + "'"
}

// realRows are the real events of testdata, decoded.
func realRows(tb testing.TB) []audit.Row {
	tb.Helper()
	var rows []audit.Row
	var d audit.Decoder
	for _, line := range audittest.Events(tb) {
		var r audit.Row
		if err := d.Decode(line, &r); err != nil {
			tb.Fatal(err)
		}
		rows = append(rows, r)
	}
	return rows
}

// classifyRows are the rows both classifications see: the real events of
// testdata and edge cases around each class's condition.
func classifyRows(t *testing.T) []audit.Row {
	rows := realRows(t)
	lock := audit.OptimisticLockMessage
	return append(rows, []audit.Row{
		{Verb: "update", Code: 409, Reason: "Conflict", Message: `Operation cannot be fulfilled on configmaps "x": ` + lock},
		{Verb: "patch", Code: 409, Reason: "Conflict", Message: lock, CauseReasons: []string{"FieldManagerConflict"}},
		{Verb: "create", Code: 409, Reason: "AlreadyExists", Message: lock},
		{Verb: "delete", Code: 409, Reason: "Conflict", Message: `Precondition failed: UID in the precondition (a) does not match UID in record (b)`},
		{Verb: "deletecollection", Code: 409, Reason: "Conflict", Message: `the ResourceVersion in the precondition (1) does not match the ResourceVersion in record (2)`},
		{Verb: "update", Code: 409, Reason: "Conflict", Message: `UID in the precondition (a) does not match`},
		{Verb: "delete", Code: 409, Reason: "Conflict", Message: "UID in the precondition (a)\ndoes not match"},
		{Verb: "delete", Code: 409, Reason: "Conflict", Message: "UID in the precondition (a)\n and then does not match"},
		{Verb: "delete", Code: 409, Reason: "Conflict", Message: "ResourceVersion in the precondition does not match"},
		{Verb: "delete", Code: 409, Reason: "Conflict", Message: "ResourceVersion in the precondition  does not match"},
		{Verb: "delete", Code: 409, Reason: "Conflict", Message: "x\nUID in the precondition (b) does not match"},
		{Verb: "update", Code: 409, Reason: "Conflict", Message: "the object has been modified"},
		{Verb: "update", Code: 409, Reason: "", Message: lock},
		{Verb: "update", Code: 200, Reason: "Conflict", Message: lock},
		{Verb: "get", Code: 409, Reason: "Conflict", Message: lock, APIGroup: "authorization.k8s.io"},
		{Verb: "create", Code: 201, APIGroup: "authentication.k8s.io"},
	}...)
}

// The sink's live counters classify a 409 and a write exactly as the
// report's SQL does: audit.ConflictClass against sql.ConflictClass, and
// audit.IsWrite against sql.IsWrite, on ClickHouse 18.16 and 26.7.
func TestConflictClassAgreesWithSQL(t *testing.T) {
	testenv.SkipIfShort(t, "loads ClickHouse 26.7 (chDB) and starts clickhouse-server")
	rows := classifyRows(t)
	query := func(r audit.Row) string {
		causes := make([]string, len(r.CauseReasons))
		for i, c := range r.CauseReasons {
			causes[i] = sqlString(c)
		}
		return fmt.Sprintf("SELECT %s AS class, toUInt8(%s) AS is_write FROM (SELECT toInt32(%d) AS code, CAST([%s] AS Array(String)) AS cause_reasons, %s AS reason, %s AS message, %s AS verb, %s AS api_group)",
			sql.ConflictClass, sql.IsWrite, r.Code, strings.Join(causes, ","), sqlString(r.Reason), sqlString(r.Message), sqlString(r.Verb), sqlString(r.APIGroup))
	}
	want := func(r audit.Row) string {
		w := "0"
		if audit.IsWrite(&r) {
			w = "1"
		}
		return audit.ConflictClass(&r) + "\t" + w
	}
	classes := map[string]bool{}
	for _, r := range rows {
		classes[audit.ConflictClass(&r)] = true
	}
	for _, c := range append(audit.ConflictClasses, "") {
		if !classes[c] {
			t.Fatalf("no row of class %q: the agreement is not tested for it", c)
		}
	}
	t.Run("ClickHouse 26.7", func(t *testing.T) {
		e := chdbtest.Open(t)
		for i, r := range rows {
			got, err := e.Query(query(r), "TabSeparated")
			if err != nil {
				t.Fatal(err)
			}
			if got = strings.TrimRight(got, "\n"); got != want(r) {
				t.Errorf("row %d (%s %d %s %q): SQL says %q, Go says %q", i, r.Verb, r.Code, r.Reason, r.Message, got, want(r))
			}
		}
	})
	t.Run("ClickHouse 18.16", func(t *testing.T) {
		ch := chtestStart(t)
		for i, r := range rows {
			got, err := ch.QueryText(t, "", query(r), "TabSeparated")
			if err != nil {
				t.Fatal(err)
			}
			if got = strings.TrimRight(got, "\n"); got != want(r) {
				t.Errorf("row %d (%s %d %s %q): SQL says %q, Go says %q", i, r.Verb, r.Code, r.Reason, r.Message, got, want(r))
			}
		}
	})
}

func tallyOf(t *testing.T, rows ...audit.Row) *Tally {
	t.Helper()
	tl := NewTally()
	for i := range rows {
		tl.Add(&rows[i])
	}
	return tl
}

func versionConflict(ns, name, writer string) audit.Row {
	return audit.Row{Stage: audit.StageResponseComplete, Verb: "update", Resource: "configmaps", Namespace: ns, Name: name,
		User: writer, Code: 409, Reason: "Conflict", Message: audit.OptimisticLockMessage}
}

func write(ns, name, writer string) audit.Row {
	return audit.Row{Stage: audit.StageResponseComplete, Verb: "update", APIGroup: "apps", Resource: "deployments",
		Namespace: ns, Name: name, User: writer, Code: 200}
}

// A batch of the real events counts as the report counts them: one
// request per ResponseComplete or Panic, write attempts, and each 409 in
// its class, by resource (kubectl's spelling) and namespace.
func TestSignalsCountAsTheReport(t *testing.T) {
	s := NewSignals(nil, SignalOptions{})
	rows := realRows(t)
	dry := versionConflict("team-a", "settings", "dry")
	dry.DryRun = true
	s.Commit("prod", tallyOf(t, append(rows, dry)...))
	for _, c := range []struct {
		what string
		got  float64
		want float64
	}{
		{"configmaps requests in team-a (RequestReceived and the dry run not counted)", testutil.ToFloat64(s.requests.WithLabelValues("prod", "configmaps", "team-a")), 6},
		{"configmaps write attempts in team-a", testutil.ToFloat64(s.writes.WithLabelValues("prod", "configmaps", "team-a")), 5},
		{"version conflicts", testutil.ToFloat64(s.conflicts.WithLabelValues("prod", "configmaps", "team-a", "version")), 1},
		{"field conflicts", testutil.ToFloat64(s.conflicts.WithLabelValues("prod", "configmaps", "team-a", "field")), 1},
		{"already exists", testutil.ToFloat64(s.conflicts.WithLabelValues("prod", "configmaps", "team-a", "already_exists")), 1},
		{"lease writes as leases.coordination.k8s.io", testutil.ToFloat64(s.writes.WithLabelValues("prod", "leases.coordination.k8s.io", "kube-system")), 1},
		{"the conflicting writer's version conflicts", testutil.ToFloat64(s.writerConflicts.WithLabelValues("prod", "system:serviceaccount:team-a:deployer")), 1},
		{"writers without a version conflict count as _other (the deployment's update is a dry run)", testutil.ToFloat64(s.writerWrites.WithLabelValues("prod", OtherLabel)), 7},
	} {
		if c.got != c.want {
			t.Errorf("%s: %v, want %v", c.what, c.got, c.want)
		}
	}
}

// Labels past their bounds count under _other, and a value once admitted
// keeps its series: the series count stays bounded however many
// namespaces and writers a storm brings.
func TestSignalsBoundTheirLabels(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	s := NewSignals(reg, SignalOptions{MaxNamespaces: 3, MaxWriters: 2, MaxClusters: 1})
	for i := range 10 {
		ns, w := fmt.Sprintf("ns-%d", i), fmt.Sprintf("writer-%d", i)
		s.Commit("prod", tallyOf(t, versionConflict(ns, "cm", w), write(ns, "web", w)))
	}
	s.Commit("staging", tallyOf(t, write("ns-0", "web", "x")))
	if got := testutil.ToFloat64(s.conflicts.WithLabelValues("prod", "configmaps", "ns-1", "version")); got != 1 {
		t.Errorf("ns-1 (admitted) version conflicts = %v, want 1", got)
	}
	if got := testutil.ToFloat64(s.conflicts.WithLabelValues("prod", "configmaps", OtherLabel, "version")); got != 7 {
		t.Errorf("_other namespace version conflicts = %v, want the 7 namespaces past the bound", got)
	}
	if got := testutil.ToFloat64(s.writerConflicts.WithLabelValues("prod", "writer-1")); got != 1 {
		t.Errorf("writer-1 version conflicts = %v, want 1", got)
	}
	if got := testutil.ToFloat64(s.writerConflicts.WithLabelValues("prod", OtherLabel)); got != 8 {
		t.Errorf("_other writer version conflicts = %v, want 8", got)
	}
	if got := testutil.ToFloat64(s.writes.WithLabelValues(OtherLabel, "deployments.apps", "ns-0")); got != 1 {
		t.Errorf("a second cluster past MaxClusters 1: %v writes under _other, want 1", got)
	}
	if n := testutil.CollectAndCount(s.writerConflicts); n != 4 {
		t.Errorf("%d writer series, want prod's 2 writers and _other, and the _other cluster's _other", n)
	}
	if n := testutil.CollectAndCount(s.conflicts); n != 9 {
		t.Errorf("%d conflict series, want 2 resources x (3 namespaces and _other) in prod, and one in the _other cluster", n)
	}
	if _, err := reg.Gather(); err != nil {
		t.Fatalf("the signals do not gather: %v", err)
	}
}

// The hot objects are the objects with the most version conflicts over
// the sliding window, with the writer that hit most of them; they leave
// the gauge once their conflicts are older than the window.
func TestHotObjectsSlideOverTheWindow(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	reg := prometheus.NewPedanticRegistry()
	s := NewSignals(reg, SignalOptions{HotObjects: 2, HotWindow: 5 * time.Minute, Now: func() time.Time { return now }})
	var storm []audit.Row
	for i := range 30 {
		storm = append(storm, versionConflict("shop", "catalog", fmt.Sprintf("controller-%c", 'a'+i%3)))
	}
	storm = append(storm, versionConflict("shop", "catalog", "controller-a"))
	for i := range 5 {
		storm = append(storm, versionConflict("shop", "cart", "legacy"), versionConflict("shop", fmt.Sprintf("one-off-%d", i), "x"))
	}
	storm = append(storm, versionConflict("shop", "cart", "legacy"))
	s.Commit("prod", tallyOf(t, storm...))
	want := `
# HELP auditsink_hot_object_version_conflicts Version conflicts over the last window (5m by default) on the objects with the most (an estimate: a bounded heavy-hitters summary), with the writer that hit most of them.
# TYPE auditsink_hot_object_version_conflicts gauge
auditsink_hot_object_version_conflicts{cluster="prod",name="cart",namespace="shop",resource="configmaps",writer="legacy"} 6
auditsink_hot_object_version_conflicts{cluster="prod",name="catalog",namespace="shop",resource="configmaps",writer="controller-a"} 31
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "auditsink_hot_object_version_conflicts"); err != nil {
		t.Error(err)
	}
	now = now.Add(3 * time.Minute)
	s.Commit("prod", tallyOf(t, versionConflict("shop", "cart", "legacy")))
	now = now.Add(2*time.Minute + time.Second)
	want = `
# HELP auditsink_hot_object_version_conflicts Version conflicts over the last window (5m by default) on the objects with the most (an estimate: a bounded heavy-hitters summary), with the writer that hit most of them.
# TYPE auditsink_hot_object_version_conflicts gauge
auditsink_hot_object_version_conflicts{cluster="prod",name="cart",namespace="shop",resource="configmaps",writer="legacy"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "auditsink_hot_object_version_conflicts"); err != nil {
		t.Errorf("5m later, only the later conflict is in the window: %v", err)
	}
	now = now.Add(5 * time.Minute)
	if n := testutil.CollectAndCount(s.hot); n != 0 {
		t.Errorf("after a quiet window %d hot objects remain, want none", n)
	}
}

// The Space-Saving summary keeps a heavy hitter of a bucket however many
// one-off objects pass through it.
func TestHotObjectsKeepTheHeavyHitter(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	s := NewSignals(nil, SignalOptions{HotObjects: 1, Now: func() time.Time { return now }})
	var rows []audit.Row
	for i := range 2000 {
		rows = append(rows, versionConflict("shop", fmt.Sprintf("one-off-%d", i), "x"))
		if i%10 == 0 {
			rows = append(rows, versionConflict("shop", "catalog", "controller-a"))
		}
	}
	s.Commit("prod", tallyOf(t, rows...))
	ch := make(chan prometheus.Metric, 10)
	s.hot.Collect(ch)
	close(ch)
	var got []string
	for m := range ch {
		var d dto.Metric
		if err := m.Write(&d); err != nil {
			t.Fatal(err)
		}
		labels := map[string]string{}
		for _, l := range d.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		got = append(got, fmt.Sprintf("%s %s %v", labels["name"], labels["writer"], d.GetGauge().GetValue()))
		if labels["name"] == "catalog" && d.GetGauge().GetValue() < 200 {
			t.Errorf("catalog counts %v, want at least its 200 conflicts (Space-Saving overestimates, never under)", d.GetGauge().GetValue())
		}
	}
	if len(got) != 1 || !strings.HasPrefix(got[0], "catalog controller-a ") {
		t.Errorf("hot objects %q, want catalog (controller-a) alone", got)
	}
}

// BenchmarkTallyAdd is the per-event cost the live signals add to the
// sink's decode loop, over a batch of the real events' shapes.
func BenchmarkTallyAdd(b *testing.B) {
	rows := realRows(b)
	tl := NewTally()
	b.ReportAllocs()
	n := 0
	for b.Loop() {
		tl.Add(&rows[n%len(rows)])
		if n++; n%400 == 0 {
			tl.Reset()
		}
	}
}
