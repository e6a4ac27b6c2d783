package sql

import (
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Expansion is what Grafana and the ClickHouse plugin substitute into a
// query before it reaches ClickHouse: the dashboard's time range and panel
// interval, and the template variables' values. Expand applies it as they
// do, so that tests (and the suite on current ClickHouse releases) can run
// the exact SQL a panel or alert rule sends.
type Expansion struct {
	// From and To are the query's time range; the plugin uses whole
	// seconds, and $__timeFilter includes both ends.
	From, To time.Time
	// Interval is the panel interval; $__interval_s is its whole seconds,
	// at least 1.
	Interval time.Duration
	// Vars are the template variables' selected values, by name. A
	// variable selected as "All" is absent from Vars and listed in All.
	Vars map[string][]string
	// All are the variables selected as "All": Grafana writes their
	// custom all value (AllValue), which percent-encoding leaves as it is.
	All map[string]bool
}

var (
	variableRef = regexp.MustCompile(`\$\{([A-Za-z0-9_]+)(?::([a-z]+))?\}`)
	timeFilter  = regexp.MustCompile(`\$__timeFilter\(\s*([^()]+?)\s*\)`)
)

// Expand substitutes the template variables (Grafana's part), then the
// plugin's macros $__timeFilter(col), $__fromTime, $__toTime and
// $__interval_s (pkg/macros of grafana/clickhouse-datasource). It fails on
// a variable without a value and on any macro left over.
func (e Expansion) Expand(sql string) (string, error) {
	var errs []string
	sql = variableRef.ReplaceAllStringFunc(sql, func(ref string) string {
		m := variableRef.FindStringSubmatch(ref)
		name, format := m[1], m[2]
		if e.All[name] {
			return AllValue
		}
		vs, ok := e.Vars[name]
		if !ok || len(vs) == 0 {
			errs = append(errs, "variable "+name+" has no value")
			return ref
		}
		switch format {
		case "percentencode":
			// Grafana encodes an array as {a,b}; one value as it is.
			if len(vs) > 1 {
				return PercentEncode("{" + strings.Join(vs, ",") + "}")
			}
			return PercentEncode(vs[0])
		case "":
			if len(vs) > 1 {
				errs = append(errs, "variable "+name+" has several values and no format")
			}
			return vs[0]
		default:
			errs = append(errs, "variable "+name+": format "+format+" is not expanded here")
			return ref
		}
	})
	from := "toDateTime(" + strconv.FormatInt(e.From.Unix(), 10) + ")"
	to := "toDateTime(" + strconv.FormatInt(e.To.Unix(), 10) + ")"
	sql = timeFilter.ReplaceAllString(sql, "$1 >= "+from+" AND $1 <= "+to)
	interval := strconv.Itoa(int(math.Max(e.Interval.Seconds(), 1)))
	sql = strings.NewReplacer("$__fromTime", from, "$__toTime", to, "$__interval_s", interval).Replace(sql)
	if i := strings.Index(sql, "$__"); i >= 0 {
		end := min(i+30, len(sql))
		errs = append(errs, "macro left over: "+sql[i:end])
	}
	if len(errs) > 0 {
		return "", fmt.Errorf("expand: %s", strings.Join(errs, "; "))
	}
	return sql, nil
}

// PercentEncode is Grafana's percentencode format of one value:
// encodeURIComponent, which also encodes !'()*: every byte but the
// letters, digits and -_.~ becomes %XX.
func PercentEncode(v string) string {
	var b strings.Builder
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.' || c == '~' {
			b.WriteByte(c)
			continue
		}
		fmt.Fprintf(&b, "%%%02X", c)
	}
	return b.String()
}
