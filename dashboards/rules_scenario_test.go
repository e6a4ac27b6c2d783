package dashboards_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stampguard/stampguard/analytics/record/recordtest"
	asql "github.com/stampguard/stampguard/analytics/sql"
	"github.com/stampguard/stampguard/analytics/store"
	"github.com/stampguard/stampguard/dashboards"
	"github.com/stampguard/stampguard/internal/audit"
	"github.com/stampguard/stampguard/test/chtest"
)

const optimisticLock = `Operation cannot be fulfilled on configmaps "x": the object has been modified; please apply your changes to the latest version and try again`

// migrated is the store of the database stampguard on srv, migrated.
func migrated(t *testing.T, srv *chtest.Server) *store.Store {
	t.Helper()
	st, err := store.Open(t.Context(), store.Options{DSN: srv.DSN(), Database: "stampguard"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if _, err := st.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	return st
}

// events builds audit rows the way the sink stores them.
type events struct {
	cluster string
	rows    []audit.Row
}

func (ev *events) add(at time.Time, writer, resource, group, ns, name string, code int32, mod func(*audit.Row)) {
	r := audit.Row{
		Cluster: ev.cluster, AuditID: fmt.Sprintf("%s-%06d", ev.cluster, len(ev.rows)), Stage: audit.StageResponseComplete, Level: "Request",
		Verb: "update", User: writer, APIGroup: group, APIVersion: "v1", Resource: resource, Namespace: ns, Name: name,
		Code: code, Stamp: "17", RequestReceivedMicros: at.UnixMicro() - 800, StageMicros: at.UnixMicro(),
		RequestURI: "/api/v1/namespaces/" + ns + "/" + resource + "/" + name, UserAgent: writer + "/v1",
	}
	if code == 409 {
		r.Reason, r.Message = "Conflict", optimisticLock
	}
	if mod != nil {
		mod(&r)
	}
	r.Fingerprint = audit.Fingerprint(&r)
	ev.rows = append(ev.rows, r)
}

// steady adds perMinute updates a minute by writer on objects cm-0..cm-9
// over [from, to), every conflictEvery-th of them a version conflict.
func (ev *events) steady(from, to time.Time, perMinute func(time.Time) int, writer string, conflictEvery int) {
	n := 0
	for m := from; m.Before(to); m = m.Add(time.Minute) {
		k := perMinute(m)
		for i := range k {
			at := m.Add(time.Duration(i) * time.Minute / time.Duration(k))
			code := int32(200)
			if n++; n%conflictEvery == 0 {
				code = 409
			}
			ev.add(at, writer, "configmaps", "", "apps", fmt.Sprintf("cm-%d", n%10), code, nil)
		}
	}
}

// TestAlertRulesOnScenarios evaluates every ClickHouse alert rule, as
// generated and provisioned, at instants over three scenarios, on a
// ClickHouse 18.16 server in America/New_York (UTC-5): windows that cross
// UTC midnight (19:00 there) must see the events after it. Every hour is
// compacted, so the rules read the hour caches for the whole hours of
// their windows and events for the rest, as in production.
func TestAlertRulesOnScenarios(t *testing.T) {
	t.Parallel() // its own ClickHouse server
	srv := chtest.StartInTimeZone(t, "America/New_York")
	ctx := t.Context()
	st := migrated(t, srv)
	// UTC midnight, 19:00 in New York. The scenarios lie in the past, so
	// that every hour of them can be compacted.
	midnight := time.Date(2026, 11, 21, 0, 0, 0, 0, time.UTC)

	// A storm across UTC midnight: a controller's steady 12 writes a
	// minute with 2 % conflicts from 20:00 UTC on; from 23:55 to 00:25 two
	// operators fight over one object, 60 writes a minute, every other
	// one a version conflict. One stampless write under an Audit policy
	// at 00:00:30.
	storm := &events{cluster: "storm"}
	storm.steady(midnight.Add(-4*time.Hour), midnight.Add(2*time.Hour), func(time.Time) int { return 12 }, "deploy-controller", 50)
	for m := midnight.Add(-5 * time.Minute); m.Before(midnight.Add(25 * time.Minute)); m = m.Add(time.Minute) {
		for i := range 60 {
			code := int32(200)
			if i%2 == 0 {
				code = 409
			}
			storm.add(m.Add(time.Duration(i)*time.Second), []string{"team-a-operator", "team-b-operator"}[i/2%2], "configmaps", "", "shop", "hot", code, nil)
		}
	}
	storm.add(midnight.Add(30*time.Second), "legacy-script", "configmaps", "", "shop", "settings", 200, func(r *audit.Row) {
		r.Stamp = ""
		r.AnnotationKeys = []string{"stamp.stampguard.dev/stamp-missing"}
		r.AnnotationValues = []string{`[{"policy":"shop","rule":"requireResourceVersion","action":"Audit","path":"metadata.resourceVersion","writer":"legacy-script"}]`}
	})

	// A lost update at 00:01:00: gitops created shop/flags, alice changed
	// data.mode, and a deploy tool's kubectl replace put the old value
	// back with a laundered stamp. Each write is logged with its response
	// (its field history).
	history := func(version uint64, hash uint64, mod func(*audit.Row)) func(*audit.Row) {
		return func(r *audit.Row) {
			r.Level, r.ObjectVersion, r.FullView = "RequestResponse", version, true
			r.Fields = audit.Fields{Paths: []string{"data.mode"}, Hashes: []uint64{hash}}
			mod(r)
		}
	}
	storm.add(midnight.Add(40*time.Second), "gitops", "configmaps", "", "shop", "flags", 201, history(100, 1, func(r *audit.Row) { r.Verb, r.Stamp, r.Created = "create", "", true }))
	storm.add(midnight.Add(50*time.Second), "alice", "configmaps", "", "shop", "flags", 200, history(101, 2, func(r *audit.Row) { r.Stamp, r.RequestManaged = "100", true }))
	storm.add(midnight.Add(60*time.Second), "deploy-tool", "configmaps", "", "shop", "flags", 200, history(102, 1, func(r *audit.Row) { r.Stamp, r.FieldManager = "101", "kubectl-replace" }))

	// A quiet night, then a morning ramp at 07:00 New York (12:00 UTC):
	// one write every 4 minutes all night (too few for a rate), then from
	// 12:00 a ramp from 5 to 65 writes a minute, an eighth of them version
	// conflicts: above the climbing rule's 5 % floor, below the storm's
	// 20 %, and the same rate all along.
	morning := midnight.Add(12 * time.Hour)
	ramp := &events{cluster: "ramp"}
	ramp.steady(morning.Add(-8*time.Hour), morning, func(m time.Time) int {
		if m.Minute()%4 == 0 {
			return 1
		}
		return 0
	}, "nightly-backup", 8)
	ramp.steady(morning, morning.Add(2*time.Hour), func(m time.Time) int { return 5 + int(m.Sub(morning)/time.Minute)/2 }, "web-controller", 8)

	// Retry loops, from 22:00 UTC: sync-controller conflicts on
	// configmaps shop/settings every 2 minutes for 4 hours (past 3 h),
	// then gives up, never succeeding; batch-job conflicts 6 times on
	// deployments.apps shop/web at 23:00 and stops, then succeeds at
	// 00:00; quick-retrier conflicts 6 times and succeeds 10 s later.
	loopsAt := midnight.Add(-2 * time.Hour)
	loops := &events{cluster: "loops"}
	for at := loopsAt; !at.After(loopsAt.Add(4 * time.Hour)); at = at.Add(2 * time.Minute) {
		loops.add(at, "sync-controller", "configmaps", "", "shop", "settings", 409, nil)
	}
	for i := range 6 {
		loops.add(loopsAt.Add(time.Hour+time.Duration(i)*time.Minute), "batch-job", "deployments", "apps", "shop", "web", 409, nil)
		loops.add(loopsAt.Add(90*time.Minute+time.Duration(i)*time.Second), "quick-retrier", "configmaps", "", "shop", "quick", 409, nil)
	}
	loops.add(loopsAt.Add(2*time.Hour), "batch-job", "deployments", "apps", "shop", "web", 200, nil)
	loops.add(loopsAt.Add(90*time.Minute+16*time.Second), "quick-retrier", "configmaps", "", "shop", "quick", 200, nil)

	for _, ev := range []*events{storm, ramp, loops} {
		if _, err := st.InsertRecords(ctx, recordtest.Set(ev.rows, nil)); err != nil {
			t.Fatal(err)
		}
	}
	res, err := st.Compact(ctx, time.Unix(0, 0), 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Hours) < 15 {
		t.Fatalf("compacted %d hours", len(res.Hours))
	}
	none := []string(nil)
	// one is the one instance of a rule whose query has no label
	// columns: the key of no labels.
	one := []string{""}

	t.Run("storm across UTC midnight", func(t *testing.T) {
		e := evaluator{t: t, srv: srv}
		rules, every := loadRules(t, dashboards.Options{Alerts: dashboards.AlertOptions{Cluster: "storm"}})
		at := grid(midnight.Add(-20*time.Minute), midnight.Add(45*time.Minute), every)
		checks := map[string]map[time.Duration][]string{
			// Pending while the rate is above 20 % for less than 5m,
			// Alerting through the storm (including windows wholly after
			// UTC midnight, which a server-time-zone day filter misses),
			// Normal once the storm left the 10m window.
			dashboards.UIDConflictStorm: {-20 * time.Minute: none, -6 * time.Minute: none, 0: none, 10 * time.Minute: one, 20 * time.Minute: one, 30 * time.Minute: one, 40 * time.Minute: none, 45 * time.Minute: none},
			// The storm's rate is far above three times the hour before.
			dashboards.UIDClimbingConflicts: {-20 * time.Minute: none, -7 * time.Minute: none, 0: one, 5 * time.Minute: one},
			// The stampless write at 00:00:30 is in the 15m window that
			// ends 1m before now from 00:01:30 to 00:16:30.
			dashboards.UIDAuditedStampless: {0: none, time.Minute: none, 2 * time.Minute: one, 16 * time.Minute: one, 17 * time.Minute: none},
			// The operators conflict and succeed in turn: no loop is left.
			dashboards.UIDStaleRetryLoop: {0: none, 30 * time.Minute: none, 45 * time.Minute: none},
			// The lost update at 00:01:00 is in the 1h window that ends 1m
			// before now from 00:02:00 on.
			dashboards.UIDLostUpdates: {0: none, time.Minute: none, 2 * time.Minute: one, 45 * time.Minute: one},
		}
		checkTimeline(t, e, rules, every, at, midnight, checks)

		// The conflicts overview marks the storm's 10m windows.
		gen, err := dashboards.Generate(dashboards.Options{})
		if err != nil {
			t.Fatal(err)
		}
		sqls, err := gen.Expanded(asql.Expansion{From: midnight.Add(-time.Hour), To: midnight.Add(time.Hour), Interval: time.Minute,
			Vars: map[string][]string{"cluster": {"storm"}, "name": {""}, "hide_system": {"no"}}, All: map[string]bool{"namespace": true, "resource": true, "user": true, "verb": true, "code": true}})
		if err != nil {
			t.Fatal(err)
		}
		name := dashboards.UIDConflicts + "/annotation/" + asql.StormIntervals.Name
		if sqls[name] == "" {
			t.Fatalf("no annotation %s", name)
		}
		out, err := srv.QueryText(t, "", "SELECT toUInt32(time) - "+fmt.Sprint(midnight.Unix())+", toUInt32(timeEnd) - toUInt32(time) FROM ("+sqls[name]+")", "")
		if err != nil {
			t.Fatal(err)
		}
		if want := "-600\t600\n0\t600\n600\t600\n1200\t600\n"; out != want {
			t.Errorf("storm annotations (seconds from midnight, length): %q, want %q", out, want)
		}
	})

	t.Run("quiet night then a morning ramp", func(t *testing.T) {
		e := evaluator{t: t, srv: srv}
		rules, every := loadRules(t, dashboards.Options{Alerts: dashboards.AlertOptions{Cluster: "ramp"}})
		at := grid(morning.Add(-20*time.Minute), morning.Add(100*time.Minute), every)
		// Quiet at every evaluation of the storm rule (for 5m: every
		// minute), every other minute for the climbing rule, every ten
		// for the others (their queries are the costly ones).
		quiet := func(every time.Duration) map[time.Duration][]string {
			q := map[time.Duration][]string{}
			for _, a := range at {
				if a.Sub(morning)%every == 0 {
					q[a.Sub(morning)] = none
				}
			}
			return q
		}
		checks := map[string]map[time.Duration][]string{
			dashboards.UIDConflictStorm: quiet(time.Minute), dashboards.UIDClimbingConflicts: quiet(2 * time.Minute),
			dashboards.UIDAuditedStampless: quiet(10 * time.Minute), dashboards.UIDStaleRetryLoop: quiet(10 * time.Minute),
		}
		checkTimeline(t, e, rules, every, at, morning, checks)
		// The scenario is the one that paged before: 10 minutes into the
		// ramp the rate is above the 5 % floor while the hour before has
		// a rate of 0 (too few writes).
		climb := ruleByUID(t, rules, dashboards.UIDClimbingConflicts)
		_, v := e.evaluate(climb, morning.Add(10*time.Minute))
		if c, d, f := v["C"], v["D"], v["F"]; len(c) != 1 || c[0].value <= 0.05 || len(d) != 1 || d[0].value != 0 || len(f) != 1 || f[0].value >= 50 {
			t.Errorf("at 07:10 the current rate is %v, the hour before %v with %v writes: want above 0.05, 0 and fewer than 50", c, d, f)
		}
		// And an hour later the baseline counts, with the same rate.
		_, v = e.evaluate(climb, morning.Add(90*time.Minute))
		if c, d, f := v["C"], v["D"], v["F"]; len(c) != 1 || len(d) != 1 || d[0].value < 0.1 || c[0].value > 3*d[0].value || f[0].value < 50 {
			t.Errorf("at 08:30 the current rate is %v, the hour before %v with %v writes: want the same rate over enough writes", c, d, f)
		}
	})

	t.Run("retry loops", func(t *testing.T) {
		e := evaluator{t: t, srv: srv}
		rules, every := loadRules(t, dashboards.Options{Alerts: dashboards.AlertOptions{Cluster: "loops"}})
		sync := "namespace=shop,object=configmaps/settings,writer=sync-controller"
		batch := "namespace=shop,object=deployments.apps/web,writer=batch-job"
		h := time.Hour
		offsets := []time.Duration{30 * time.Minute, h + 10*time.Minute, h + 30*time.Minute, 2*h + 10*time.Minute, 3*h + 30*time.Minute,
			4*h + 10*time.Minute, 4*h + 20*time.Minute, 7*h + 30*time.Minute, 30 * h, 4*h + 7*24*h + 2*h}
		var at []time.Time
		for _, o := range offsets {
			at = append(at, loopsAt.Add(o))
		}
		checks := map[string]map[time.Duration][]string{
			// sync-controller is still looping at 3h30m (not stale), gave
			// up at 4h: Alerting from 15m (+1m lag) later, still 3h30m
			// after its last conflict and a day later; quiet only once its
			// conflicts are older than the 7 days searched. batch-job
			// fires 15m after its last conflict and resolves with its
			// success at 2h. quick-retrier never fires.
			dashboards.UIDStaleRetryLoop: {
				30 * time.Minute: none, h + 10*time.Minute: none, h + 30*time.Minute: {batch}, 2*h + 10*time.Minute: none,
				3*h + 30*time.Minute: none, 4*h + 10*time.Minute: none, 4*h + 20*time.Minute: {sync}, 7*h + 30*time.Minute: {sync},
				30 * h: {sync}, 4*h + 7*24*h + 2*h: none,
			},
			dashboards.UIDAuditedStampless: {30 * time.Minute: none, 4*h + 20*time.Minute: none},
		}
		checkTimeline(t, e, rules, every, at, loopsAt, checks)
		// The rule carry the cluster as a static label and the
		// summary names the writer and the object.
		r := ruleByUID(t, rules, dashboards.UIDStaleRetryLoop)
		if r.Labels["cluster"] != "loops" || r.DashboardUID != dashboards.UIDHotObjects || r.PanelID == 0 {
			t.Errorf("rule %q: labels %v, panel %s/%d", r.Title, r.Labels, r.DashboardUID, r.PanelID)
		}
	})
}

// checkTimeline evaluates each rule with checks over the instants and
// compares the instances Alerting at each checked offset from origin.
// A rule with a `for` (the storm's 5m) is evaluated at every instant of
// the grid at; one without is stateless between evaluations, so it is
// evaluated at its checked instants only, which is exact for it.
func checkTimeline(t *testing.T, e evaluator, rules []provRule, every time.Duration, at []time.Time, origin time.Time, checks map[string]map[time.Duration][]string) {
	t.Helper()
	for uid, want := range checks {
		r := ruleByUID(t, rules, uid)
		instants := at
		if r.For == "0s" {
			// Stateless: its checked instants are enough.
			instants = nil
			for off := range want {
				instants = append(instants, origin.Add(off))
			}
			slices.SortFunc(instants, time.Time.Compare)
		}
		at := instants
		firing, _ := e.timeline(r, every, at)
		checked := 0
		var trace []string
		for i, a := range at {
			off := a.Sub(origin)
			trace = append(trace, fmt.Sprintf("%s:%d", off, len(firing[i])))
			w, ok := want[off]
			if !ok {
				continue
			}
			checked++
			if !sameKeys(firing[i], w) {
				t.Errorf("rule %q at %s (%s UTC): Alerting %q, want %q", r.Title, off, a.UTC().Format("15:04"), firing[i], w)
			}
		}
		if checked != len(want) {
			t.Errorf("rule %q: %d of %d checks at an evaluated instant", r.Title, checked, len(want))
		}
		t.Logf("rule %q: alerting instances by offset: %s", r.Title, strings.Join(trace, " "))
	}
}
