package sql

import (
	"regexp"
	"strings"
	"testing"
	"time"
)

func TestStatementsDeclareWhatTheyUse(t *testing.T) {
	names := map[string]bool{}
	for _, s := range All {
		if err := s.Validate(); err != nil {
			t.Error(err)
		}
		if names[s.Name] {
			t.Errorf("two statements named %s", s.Name)
		}
		names[s.Name] = true
	}
}

func TestValidateNamesTheProblem(t *testing.T) {
	cases := map[string]struct {
		s    Statement
		want string
	}{
		"an undeclared parameter": {Statement{Name: "x", Columns: []string{"a"}, SQL: "SELECT @top"}, "uses parameters [top], declares []"},
		"an undeclared window": {Statement{Name: "x", Columns: []string{"a"}, Params: []Param{Top}, SQL: "SELECT @top WHERE {window}"},
			"places time with [{window}], declares []"},
		"a series without its time column": {Statement{Name: "x", Shape: Series, Columns: []string{"a"}, SQL: "SELECT 1"}, "starts with the column time"},
	}
	for name, c := range cases {
		err := c.s.Validate()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want %q", name, err, c.want)
		}
	}
}

// dashboardBinder binds as the dashboards do.
var dashboardBinder = Grafana{Database: "stampguard",
	Variables: map[string]Variable{"cluster": {Name: "cluster"}, "namespace": {Name: "namespace", Multi: true}, "resource": {Name: "resource", Multi: true}, "user": {Name: "user", Multi: true}, "name": {Name: "name"}},
	Values:    map[string]string{"top": "20", "gap_us": "300000000", "threshold": "5", "min_writes": "20", "stale_us": "600000000"}}

var leftover = regexp.MustCompile(`@[a-z_]+|\{[a-z_]+\}`)

func TestGrafanaBindsEveryPlaceholder(t *testing.T) {
	for _, s := range All {
		sql, err := dashboardBinder.Bind(s)
		if err != nil {
			t.Fatal(err)
		}
		if m := leftover.FindString(sql); m != "" {
			t.Errorf("%s: %s left over", s.Name, m)
		}
		if strings.Contains(sql, "$__timeInterval") || strings.Contains(sql, "toStartOfInterval") {
			t.Errorf("%s: uses toStartOfInterval, which 18.16 lacks", s.Name)
		}
	}
	if _, err := (Grafana{Database: "db"}).Bind(Totals); err == nil || !strings.Contains(err.Error(), "parameter cluster has neither") {
		t.Errorf("a missing parameter: %v", err)
	}
}

func TestReportBindsEveryPlaceholder(t *testing.T) {
	for _, s := range All {
		sql := Report{Database: "db"}.Bind(s)
		if m := regexp.MustCompile(`\{[a-z_]+\}`).FindString(sql); m != "" {
			t.Errorf("%s: %s left over", s.Name, m)
		}
	}
}

func TestExpandAsGrafanaAndThePlugin(t *testing.T) {
	from, to := time.Unix(1700000000, 0), time.Unix(1700003600, 999_000_000)
	sql := `cluster = ${cluster:singlequote} AND ns IN (${namespace:singlequote}) AND u IN (${user:singlequote}) AND $__timeFilter(event_time) AND d >= toDate($__fromTime) AND e <= $__toTime AND b = $__interval_s`
	e := Expansion{From: from, To: to, Interval: 300 * time.Millisecond,
		Vars: map[string][]string{"cluster": {"prod"}, "namespace": {"a", "o'b"}}, All: map[string]bool{"user": true}}
	got, err := e.Expand(sql)
	if err != nil {
		t.Fatal(err)
	}
	want := `cluster = 'prod' AND ns IN ('a','o\'b') AND u IN ('__all__') AND event_time >= toDateTime(1700000000) AND event_time <= toDateTime(1700003600) AND d >= toDate(toDateTime(1700000000)) AND e <= toDateTime(1700003600) AND b = 1`
	if got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	for name, bad := range map[string]string{
		"a variable without a value": "${resource:singlequote}",
		"an unknown macro":           "$__timeInterval(event_time)",
		"several values unformatted": "${namespace}",
	} {
		if _, err := e.Expand(bad); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func TestBothBindersPlaceEveryWindow(t *testing.T) {
	var text []string
	for _, w := range Windows {
		text = append(text, w.Placeholder)
	}
	s := Statement{Name: "all windows", Shape: Rows, Columns: []string{"x"}, Time: Windows, Params: []Param{IntervalS},
		SQL: "SELECT 1 WHERE " + strings.Join(text, " AND ")}
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
	g, err := dashboardBinder.Bind(s)
	if err != nil {
		t.Fatal(err)
	}
	for name, sql := range map[string]string{"report": Report{Database: "db"}.Bind(s), "grafana": g} {
		if m := regexp.MustCompile(`\{[a-z_]+\}`).FindString(sql); m != "" {
			t.Errorf("the %s binder leaves %s", name, m)
		}
	}
}

// TestInstantKeyCollisionsReadWhereTheStatementsDo: the check reads where
// the report's keyed reads do (the raw edges of the counting statements),
// not the reads that match by identity anyway (policy decisions, the raw
// retry-loop rows).
func TestInstantKeyCollisionsReadWhereTheStatementsDo(t *testing.T) {
	for _, raw := range []bool{false, true} {
		q := Report{Database: "db", RawLoops: raw, NoDuplicates: true}.InstantKeyCollisions(ReportStatements...)
		if !strings.Contains(q, "PREWHERE (("+reportRawWindow+" AND "+reportRawWindow+")) AND") {
			t.Errorf("raw loops %v: the check does not read the raw edges alone:\n%s", raw, q)
		}
		for _, not := range []string{"annotation_keys", "code = 409"} {
			if strings.Contains(q, not) {
				t.Errorf("raw loops %v: the check reads %s:\n%s", raw, not, q)
			}
		}
	}
	if q := (Report{Database: "db"}).InstantKeyCollisions(LeaseHolderChanges, PolicyDecisions); q != "" {
		t.Errorf("statements without keyed reads need no check, got %s", q)
	}
}
