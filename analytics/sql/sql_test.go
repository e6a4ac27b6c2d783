package sql

import (
	"regexp"
	"slices"
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
	Variables: map[string]Variable{"cluster": {Name: "cluster"}, "namespace": {Name: "namespace", Multi: true}, "resource": {Name: "resource", Multi: true}, "user": {Name: "user", Multi: true}, "name": {Name: "name"},
		"verb": {Name: "verb", Multi: true}, "code": {Name: "code", Multi: true}, "hide_system": {Name: "hide_system"}},
	Values: map[string]string{"top": "20", "gap_us": "300000000", "threshold": "5", "min_handoffs": "3", "min_writes": "20", "stale_us": "600000000", "storm_s": "600", "storm_rate": "0.2", "min_bucket_writes": "10"}}

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

// TestRequestFiltersOnlyWhereEventsAreRead binds every statement for the
// dashboards: the verb and code filters appear in exactly the statements
// that declare them, and those read no hour cache (which keep neither,
// but for hour_version_conflicts: its rows keep their verb, and their
// code is 409), and a minute cache only under the condition that they
// select any request; the toggle reaches every statement with the other
// filters.
func TestRequestFiltersOnlyWhereEventsAreRead(t *testing.T) {
	cacheRead := regexp.MustCompile(`\{db\}\.(hour|minute)_[a-z_]+`)
	declaring := 0
	for _, s := range All {
		sql, err := dashboardBinder.Bind(s)
		if err != nil {
			t.Fatal(err)
		}
		declares := slices.Contains(s.Params, Verb)
		if declares != slices.Contains(s.Params, Code) {
			t.Errorf("%s declares one of verb and code", s.Name)
		}
		if got := strings.Contains(sql, "${verb:percentencode}") && strings.Contains(sql, "${code:percentencode}"); got != declares {
			t.Errorf("%s: filters by verb and code %v, declares them %v", s.Name, got, declares)
		}
		if declares {
			declaring++
			// A cache only under the condition that no request filter
			// narrows.
			for _, at := range cacheRead.FindAllStringIndex(s.SQL, -1) {
				if s.SQL[at[0]:at[1]] == "{db}.hour_version_conflicts" {
					continue
				}
				where := s.SQL[at[1]:]
				if i := strings.Index(where, "cluster = @cluster"); !strings.HasPrefix(strings.TrimLeft(where, "\n\t"), "WHERE ") || i < 0 || !strings.Contains(where[:i], unfilteredRequests) {
					t.Errorf("%s filters by verb and code but reads %s without the gate on them", s.Name, s.SQL[at[0]:at[1]])
				}
			}
		}
		if slices.Contains(s.Params, User) != strings.Contains(sql, "${hide_system:percentencode}") {
			t.Errorf("%s: the writer filter and the system-writer toggle do not go together", s.Name)
		}
	}
	if declaring < 5 {
		t.Errorf("only %d statements filter by verb and code", declaring)
	}
	if _, err := (Grafana{Database: "db", Variables: map[string]Variable{"hide_system": {Name: "hide_system", Multi: true}}, Values: map[string]string{"cluster": "''", "namespace": "''", "resource": "''", "user": "''", "name": "''"}}).Bind(Totals); err == nil || !strings.Contains(err.Error(), "toggle hide_system") {
		t.Errorf("a multi-value toggle: %v", err)
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
	sql := `cluster = '${cluster:percentencode}' AND ns = '${namespace:percentencode}' AND u = '${user:percentencode}' AND $__timeFilter(event_time) AND d >= toDate($__fromTime) AND e <= $__toTime AND b = $__interval_s`
	e := Expansion{From: from, To: to, Interval: 300 * time.Millisecond,
		Vars: map[string][]string{"cluster": {`DOMAIN\prod`}, "namespace": {"a", "o'b (x)!*~é"}}, All: map[string]bool{"user": true}}
	got, err := e.Expand(sql)
	if err != nil {
		t.Fatal(err)
	}
	want := `cluster = 'DOMAIN%5Cprod' AND ns = '%7Ba%2Co%27b%20%28x%29%21%2A~%C3%A9%7D' AND u = '__all__' AND event_time >= toDateTime(1700000000) AND event_time <= toDateTime(1700003600) AND d >= toDate(toDateTime(1700000000)) AND e <= toDateTime(1700003600) AND b = 1`
	if got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	for name, bad := range map[string]string{
		"a variable without a value":   "${resource:percentencode}",
		"a format that can be escaped": "${cluster:singlequote}",
		"an unknown macro":             "$__timeInterval(event_time)",
		"several values unformatted":   "${namespace}",
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

func TestPlanReportSplitsTheWindow(t *testing.T) {
	h := func(n int) time.Time { return time.Date(2026, 12, 1, n, 0, 0, 0, time.UTC) }
	us := func(t time.Time) int64 { return t.UnixMicro() }
	at := func(n, m int, s ...int) time.Time {
		t := h(n).Add(time.Duration(m) * time.Minute)
		if len(s) > 0 {
			t = t.Add(time.Duration(s[0]) * time.Second)
		}
		return t
	}
	c := func(n int, v uint64) CleanHour { return CleanHour{Hour: h(n), Version: v} }
	part := func(c CleanHour, from, until time.Time) PartialHour {
		return PartialHour{CleanHour: c, From: us(from), Until: us(until)}
	}
	cases := []struct {
		name         string
		since, until time.Time
		clean        []CleanHour
		wantClean    int
		wantPartial  []PartialHour
		wantRaw      [][2]int64
	}{
		{"without clean hours the whole window is raw", at(1, 20), at(5, 10), nil, 0, nil,
			[][2]int64{{us(at(1, 20)), us(at(5, 10))}}},
		{"clean whole hours are cut out, the edges stay raw", at(1, 20), at(5, 10),
			[]CleanHour{c(2, 7), c(3, 8), c(4, 9)}, 3, nil,
			[][2]int64{{us(at(1, 20)), us(h(2))}, {us(h(5)), us(at(5, 10))}}},
		{"a dirty hour between clean ones is read raw", h(1), h(5),
			[]CleanHour{c(3, 2), c(1, 1), c(4, 3)}, 3, nil,
			[][2]int64{{us(h(2)), us(h(3))}}},
		{"a cut hour with minute caches reads its whole minutes from them", at(1, 30, 5), at(2, 30, 7),
			[]CleanHour{c(1, 1), c(2, 2)}, 0,
			[]PartialHour{part(c(1, 1), at(1, 31), h(2)), part(c(2, 2), h(2), at(2, 30))},
			[][2]int64{{us(at(1, 30, 5)), us(at(1, 31))}, {us(at(2, 30)), us(at(2, 30, 7))}}},
		{"a window inside one minute of a clean hour is raw", at(1, 30, 5), at(1, 30, 50),
			[]CleanHour{c(1, 1)}, 0, nil,
			[][2]int64{{us(at(1, 30, 5)), us(at(1, 30, 50))}}},
		{"whole hours, partial hours and dirty hours together", at(0, 59, 59), at(4, 0, 1),
			[]CleanHour{c(0, 1), c(1, 2), c(3, 4), c(4, 5)}, 2, nil,
			[][2]int64{{us(at(0, 59, 59)), us(h(1))}, {us(h(2)), us(h(3))}, {us(h(4)), us(at(4, 0, 1))}}},
		{"a window of clean hours reads nothing raw", h(1), h(3),
			[]CleanHour{c(1, 1), c(2, 2)}, 2, nil, nil},
	}
	for _, c := range cases {
		p := PlanReport(c.since, c.until, c.clean)
		if len(p.Clean) != c.wantClean || !slices.Equal(p.Partial, c.wantPartial) || !slices.Equal(p.Raw, c.wantRaw) {
			t.Errorf("%s: %d clean hours, partial %v and raw %v, want %d, %v and %v", c.name, len(p.Clean), p.Partial, p.Raw, c.wantClean, c.wantPartial, c.wantRaw)
		}
		// The parts cover the window once: the clean hours, the partial
		// hours' minutes and the raw ranges add up to it.
		var covered int64
		for _, r := range p.Raw {
			covered += r[1] - r[0]
		}
		for _, m := range p.Partial {
			covered += m.Until - m.From
		}
		covered += int64(len(p.Clean)) * time.Hour.Microseconds()
		if covered != us(c.until)-us(c.since) {
			t.Errorf("%s: the plan covers %d µs of a %d µs window", c.name, covered, us(c.until)-us(c.since))
		}
	}
}
