package dashboards_test

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode"

	"sigs.k8s.io/yaml"

	asql "github.com/stampguard/stampguard/analytics/sql"
	"github.com/stampguard/stampguard/dashboards"
	"github.com/stampguard/stampguard/test/chtest"
)

// This file evaluates the generated Grafana alert rules the way Grafana's
// scheduler does, against a real ClickHouse: each rule's data queries as
// the provisioning file holds them (the plugin's macros expanded for the
// query's relative time range at the evaluation instant, as
// grafana-clickhouse-datasource >= 4.0.3 expands them), the results
// turned into numbers with labels (Grafana's numeric data: string columns
// are labels, the one numeric column the value), then the rule's reduce,
// threshold and math expressions, its condition, its noDataState and its
// `for`.

// provRule is one rule of the provisioning file, as Grafana reads it.
type provRule struct {
	UID          string            `json:"uid"`
	Title        string            `json:"title"`
	Condition    string            `json:"condition"`
	For          string            `json:"for"`
	NoDataState  string            `json:"noDataState"`
	Labels       map[string]string `json:"labels"`
	DashboardUID string            `json:"dashboardUid"`
	PanelID      int64             `json:"panelId"`
	Data         []struct {
		RefID             string `json:"refId"`
		DatasourceUID     string `json:"datasourceUid"`
		RelativeTimeRange *struct {
			From, To int64
		} `json:"relativeTimeRange"`
		Model json.RawMessage `json:"model"`
	} `json:"data"`
}

// exprModel is the part of a query model the evaluator reads: a
// ClickHouse query's rawSql, or a server-side expression.
type exprModel struct {
	RawSQL     string `json:"rawSql"`
	Format     *int   `json:"format"`
	Type       string `json:"type"`
	Expression string `json:"expression"`
	Reducer    string `json:"reducer"`
	Conditions []struct {
		Evaluator struct {
			Type   string    `json:"type"`
			Params []float64 `json:"params"`
		} `json:"evaluator"`
	} `json:"conditions"`
}

// loadRules generates the provisioning file for o and parses it back: the
// rules as Grafana would read them, and the group's evaluation interval.
func loadRules(t *testing.T, o dashboards.Options) ([]provRule, time.Duration) {
	t.Helper()
	g, err := dashboards.Generate(o)
	if err != nil {
		t.Fatal(err)
	}
	files, err := g.Files()
	if err != nil {
		t.Fatal(err)
	}
	js, err := yaml.YAMLToJSON(files[dashboards.AlertRulesFile])
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Groups []struct {
			Interval string     `json:"interval"`
			Rules    []provRule `json:"rules"`
		} `json:"groups"`
	}
	if err := json.Unmarshal(js, &f); err != nil {
		t.Fatal(err)
	}
	if len(f.Groups) != 1 {
		t.Fatalf("%d groups", len(f.Groups))
	}
	every, err := time.ParseDuration(f.Groups[0].Interval)
	if err != nil {
		t.Fatal(err)
	}
	return f.Groups[0].Rules, every
}

// number is one value with its labels: an item of Grafana's numeric data.
type number struct {
	labels map[string]string
	value  float64
}

func (n number) key() string {
	var ks []string
	for k, v := range n.labels {
		ks = append(ks, k+"="+v)
	}
	sort.Strings(ks)
	return strings.Join(ks, ",")
}

// evaluator runs rules against a server.
type evaluator struct {
	t   *testing.T
	srv *chtest.Server
}

// query runs one ClickHouse data query at now and returns its numbers; no
// rows is no data (nil).
func (e evaluator) query(rawSQL string, now time.Time, from, to int64) []number {
	e.t.Helper()
	exp := asql.Expansion{From: now.Add(-time.Duration(from) * time.Second), To: now.Add(-time.Duration(to) * time.Second), Interval: time.Second}
	sql, err := exp.Expand(rawSQL)
	if err != nil {
		e.t.Fatal(err)
	}
	out, err := e.srv.QueryText(e.t, "", sql, "JSON")
	if err != nil {
		e.t.Fatalf("at %s: %v\n%s", now.UTC(), err, sql)
	}
	var res struct {
		Meta []struct{ Name, Type string }
		Data []map[string]json.RawMessage
	}
	d := json.NewDecoder(strings.NewReader(out))
	d.UseNumber()
	if err := d.Decode(&res); err != nil {
		e.t.Fatal(err)
	}
	var ns []number
	for _, row := range res.Data {
		n := number{labels: map[string]string{}}
		numeric := 0
		for _, m := range res.Meta {
			if strings.Contains(m.Type, "String") {
				var s string
				if err := json.Unmarshal(row[m.Name], &s); err != nil {
					e.t.Fatal(err)
				}
				n.labels[m.Name] = s
				continue
			}
			numeric++
			// 64-bit integers come quoted.
			v, err := strconv.ParseFloat(strings.Trim(string(row[m.Name]), `"`), 64)
			if err != nil {
				e.t.Fatalf("column %s (%s): %v", m.Name, m.Type, err)
			}
			n.value = v
		}
		if numeric != 1 {
			e.t.Fatalf("a row with %d numeric columns (%v): Grafana takes exactly one as the value", numeric, res.Meta)
		}
		ns = append(ns, n)
	}
	return ns
}

// evaluate runs rule r at now and returns its condition's numbers, and
// every refId's (for the test's own sanity checks). nil is no data.
func (e evaluator) evaluate(r provRule, now time.Time) ([]number, map[string][]number) {
	e.t.Helper()
	vals := map[string][]number{}
	for _, q := range r.Data {
		var m exprModel
		if err := json.Unmarshal(q.Model, &m); err != nil {
			e.t.Fatal(err)
		}
		switch {
		case q.DatasourceUID == "__expr__":
			vals[q.RefID] = e.expression(r, m, vals)
		case m.RawSQL != "":
			if q.RelativeTimeRange == nil {
				e.t.Fatalf("rule %q: query %s has no relative time range", r.Title, q.RefID)
			}
			if m.Format == nil || *m.Format != int(dashboards.FormatTable) {
				e.t.Fatalf("rule %q: query %s is not in table format: Grafana would not read numbers from it", r.Title, q.RefID)
			}
			vals[q.RefID] = e.query(m.RawSQL, now, q.RelativeTimeRange.From, q.RelativeTimeRange.To)
		default:
			e.t.Fatalf("rule %q: query %s is not ClickHouse", r.Title, q.RefID)
		}
	}
	return vals[r.Condition], vals
}

func (e evaluator) expression(r provRule, m exprModel, vals map[string][]number) []number {
	e.t.Helper()
	switch m.Type {
	case "reduce":
		// Reduce on numbers passes them through (a series would be
		// reduced to its last point); the SQL returns numbers.
		if m.Reducer != "last" {
			e.t.Fatalf("rule %q: reducer %s", r.Title, m.Reducer)
		}
		return vals[m.Expression]
	case "threshold":
		if len(m.Conditions) != 1 || len(m.Conditions[0].Evaluator.Params) != 1 {
			e.t.Fatalf("rule %q: threshold %+v", r.Title, m.Conditions)
		}
		ev := m.Conditions[0].Evaluator
		var out []number
		for _, n := range vals[m.Expression] {
			var hit bool
			switch ev.Type {
			case "gt":
				hit = n.value > ev.Params[0]
			case "lt":
				hit = n.value < ev.Params[0]
			default:
				e.t.Fatalf("rule %q: threshold type %s", r.Title, ev.Type)
			}
			out = append(out, number{n.labels, b2f(hit)})
		}
		return out
	case "math":
		p := &mathParser{src: m.Expression, vals: vals}
		out, err := p.parse()
		if err != nil {
			e.t.Fatalf("rule %q: math %q: %v", r.Title, m.Expression, err)
		}
		return out
	}
	e.t.Fatalf("rule %q: expression type %q", r.Title, m.Type)
	return nil
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// mathParser evaluates Grafana's math expressions over numbers: $A
// references, numbers, arithmetic, comparisons, && and ||, with
// Grafana's precedence (|| < && < comparisons < + - < * /). A binary
// operation joins its operands' numbers whose labels are a subset of the
// other's; no data on either side is no data.
type mathParser struct {
	src  string
	pos  int
	vals map[string][]number
}

var precedence = map[string]int{"||": 1, "&&": 2, "==": 3, "!=": 3, ">": 3, "<": 3, ">=": 3, "<=": 3, "+": 4, "-": 4, "*": 5, "/": 5}

func (p *mathParser) parse() ([]number, error) {
	v, err := p.binary(1)
	if err != nil {
		return nil, err
	}
	if p.skip(); p.pos != len(p.src) {
		return nil, fmt.Errorf("unexpected %q", p.src[p.pos:])
	}
	return v, nil
}

func (p *mathParser) skip() {
	for p.pos < len(p.src) && p.src[p.pos] == ' ' {
		p.pos++
	}
}

func (p *mathParser) op() string {
	p.skip()
	for _, o := range []string{"||", "&&", "==", "!=", ">=", "<=", ">", "<", "+", "-", "*", "/"} {
		if strings.HasPrefix(p.src[p.pos:], o) {
			return o
		}
	}
	return ""
}

func (p *mathParser) binary(minPrec int) ([]number, error) {
	left, err := p.operand()
	if err != nil {
		return nil, err
	}
	for {
		o := p.op()
		if o == "" || precedence[o] < minPrec {
			return left, nil
		}
		p.pos += len(o)
		right, err := p.binary(precedence[o] + 1)
		if err != nil {
			return nil, err
		}
		left = join(o, left, right)
	}
}

// scalar marks a literal: it joins every number of the other side.
const scalar = "\x00scalar"

func (p *mathParser) operand() ([]number, error) {
	p.skip()
	if p.pos >= len(p.src) {
		return nil, fmt.Errorf("expression ends early")
	}
	switch p.src[p.pos] {
	case '(':
		p.pos++
		v, err := p.binary(1)
		if err != nil {
			return nil, err
		}
		if p.skip(); p.pos >= len(p.src) || p.src[p.pos] != ')' {
			return nil, fmt.Errorf("no closing parenthesis")
		}
		p.pos++
		return v, nil
	case '$':
		p.pos++
		start := p.pos
		for p.pos < len(p.src) && (unicode.IsLetter(rune(p.src[p.pos])) || unicode.IsDigit(rune(p.src[p.pos]))) {
			p.pos++
		}
		ref := p.src[start:p.pos]
		v, ok := p.vals[ref]
		if !ok {
			return nil, fmt.Errorf("$%s is no earlier refId", ref)
		}
		return v, nil
	default:
		start := p.pos
		for p.pos < len(p.src) && (p.src[p.pos] >= '0' && p.src[p.pos] <= '9' || p.src[p.pos] == '.' || p.src[p.pos] == 'e') {
			p.pos++
		}
		f, err := strconv.ParseFloat(p.src[start:p.pos], 64)
		if err != nil {
			return nil, fmt.Errorf("at %q: %w", p.src[start:], err)
		}
		return []number{{labels: map[string]string{scalar: ""}, value: f}}, nil
	}
}

func subset(a, b map[string]string) bool {
	for k, v := range a {
		if k == scalar {
			continue
		}
		if b[k] != v {
			return false
		}
	}
	return true
}

func join(op string, left, right []number) []number {
	var out []number
	for _, l := range left {
		for _, r := range right {
			if !subset(l.labels, r.labels) && !subset(r.labels, l.labels) {
				continue
			}
			labels := map[string]string{}
			for _, m := range []map[string]string{l.labels, r.labels} {
				for k, v := range m {
					labels[k] = v
				}
			}
			if _, ok := l.labels[scalar]; !ok {
				delete(labels, scalar)
			} else if _, ok := r.labels[scalar]; !ok {
				delete(labels, scalar)
			}
			a, b := l.value, r.value
			var v float64
			switch op {
			case "||":
				v = b2f(a != 0 || b != 0)
			case "&&":
				v = b2f(a != 0 && b != 0)
			case "==":
				v = b2f(a == b)
			case "!=":
				v = b2f(a != b)
			case ">":
				v = b2f(a > b)
			case "<":
				v = b2f(a < b)
			case ">=":
				v = b2f(a >= b)
			case "<=":
				v = b2f(a <= b)
			case "+":
				v = a + b
			case "-":
				v = a - b
			case "*":
				v = a * b
			case "/":
				v = a / b
			}
			out = append(out, number{labels, v})
		}
	}
	return out
}

// The states of an alert instance.
const (
	normal   = "Normal"
	pending  = "Pending"
	alerting = "Alerting"
)

// instance is one alert instance's state.
type instance struct {
	state    string
	activeAt time.Time
}

// scheduler is one rule's alert instances over evaluations, as Grafana's
// state manager keeps them: a number that is not 0 is Pending, and
// Alerting once it has been so for the rule's `for` (at once for 0s);
// 0, or a missing instance, is Normal (Grafana resolves a missing one
// within MissingSeriesEvalsToResolve evaluations); no data is the rule's
// noDataState, which for every ClickHouse rule is OK: Normal.
type scheduler struct {
	rule      provRule
	forDur    time.Duration
	instances map[string]*instance
}

func newScheduler(t *testing.T, r provRule) *scheduler {
	d, err := time.ParseDuration(r.For)
	if err != nil {
		t.Fatalf("rule %q: for %q: %v", r.Title, r.For, err)
	}
	if r.NoDataState != "OK" {
		t.Fatalf("rule %q: noDataState %s: the scenarios expect OK", r.Title, r.NoDataState)
	}
	return &scheduler{rule: r, forDur: d, instances: map[string]*instance{}}
}

// step applies the condition's numbers at now and returns the keys of the
// instances Alerting.
func (s *scheduler) step(now time.Time, cond []number) []string {
	seen := map[string]bool{}
	for _, n := range cond {
		k := n.key()
		seen[k] = true
		in := s.instances[k]
		if in == nil {
			in = &instance{state: normal}
			s.instances[k] = in
		}
		switch {
		case n.value == 0 || math.IsNaN(n.value):
			in.state = normal
		case in.state == normal:
			in.state, in.activeAt = pending, now
			if s.forDur == 0 {
				in.state = alerting
			}
		case in.state == pending && now.Sub(in.activeAt) >= s.forDur:
			in.state = alerting
		}
	}
	var firing []string
	for k, in := range s.instances {
		if !seen[k] {
			delete(s.instances, k)
			continue
		}
		if in.state == alerting {
			firing = append(firing, k)
		}
	}
	sort.Strings(firing)
	return firing
}

// ruleByUID finds the rule whose UID has the base uid.
func ruleByUID(t *testing.T, rules []provRule, base string) provRule {
	t.Helper()
	for _, r := range rules {
		if strings.HasPrefix(r.UID, base+"-") {
			return r
		}
	}
	t.Fatalf("no rule %s", base)
	return provRule{}
}

// timeline evaluates rule at each instant (in order) and returns the
// keys Alerting at each, and each instant's values by refId. A rule with
// a `for` needs consecutive instants one group interval apart.
func (e evaluator) timeline(r provRule, every time.Duration, instants []time.Time) ([][]string, []map[string][]number) {
	e.t.Helper()
	s := newScheduler(e.t, r)
	var firing [][]string
	var vals []map[string][]number
	for i, at := range instants {
		if s.forDur > 0 && i > 0 && at.Sub(instants[i-1]) != every {
			e.t.Fatalf("rule %q has for %s: instants %s and %s are not one interval (%s) apart", r.Title, r.For, instants[i-1], at, every)
		}
		cond, v := e.evaluate(r, at)
		firing = append(firing, s.step(at, cond))
		vals = append(vals, v)
	}
	return firing, vals
}

// grid is every interval from from to to, both included.
func grid(from, to time.Time, every time.Duration) []time.Time {
	var ts []time.Time
	for at := from; !at.After(to); at = at.Add(every) {
		ts = append(ts, at)
	}
	return ts
}

func sameKeys(a, b []string) bool {
	return slices.Equal(a, b) || len(a) == 0 && len(b) == 0
}
