package dashboards

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/grafana/grafana-foundation-sdk/go/alerting"
	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/cog/plugins"
	"github.com/grafana/grafana-foundation-sdk/go/cog/variants"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/datasource"
	"sigs.k8s.io/yaml"

	asql "github.com/stampguard/stampguard/analytics/sql"
)

func generated(t *testing.T) (*Generated, map[string][]byte) {
	t.Helper()
	g, err := Generate(Options{})
	if err != nil {
		t.Fatal(err)
	}
	files, err := g.Files()
	if err != nil {
		t.Fatal(err)
	}
	return g, files
}

// TestGeneratedFilesAreCurrent fails when the committed files differ from
// what the generator writes now: run `go generate ./dashboards`.
func TestGeneratedFilesAreCurrent(t *testing.T) {
	_, files := generated(t)
	entries, err := os.ReadDir(OutputDir)
	if err != nil {
		t.Fatal(err)
	}
	var committed []string
	for _, e := range entries {
		committed = append(committed, e.Name())
	}
	var want []string
	for n, b := range files {
		want = append(want, n)
		got, err := os.ReadFile(filepath.Join(OutputDir, n))
		if err != nil {
			t.Errorf("%s is not committed: run go generate ./dashboards", n)
			continue
		}
		if !bytes.Equal(got, b) {
			t.Errorf("%s differs from the generator's output: run go generate ./dashboards", n)
		}
	}
	slices.Sort(want)
	if !slices.Equal(committed, want) {
		t.Errorf("%s holds %v, the generator writes %v", OutputDir, committed, want)
	}
}

// strict drops the typed-nil cog.BuildErrors that the SDK's generated
// UnmarshalJSONStrict functions return, as a non-nil error, when nothing
// failed.
func strict(err error) error {
	var be cog.BuildErrors
	if errors.As(err, &be) && len(be) == 0 {
		return nil
	}
	return err
}

func registerVariants() {
	plugins.RegisterDefaultPlugins()
	cog.NewRuntime().RegisterDataqueryVariant(ClickHouseVariant())
}

// TestDashboardsStructure decodes each committed dashboard strictly into
// the SDK's type and checks what Grafana relies on.
func TestDashboardsStructure(t *testing.T) {
	registerVariants()
	for _, uid := range []string{UIDConflicts, UIDHotObjects, UIDPolicy, UIDLeases, UIDHealth} {
		t.Run(uid, func(t *testing.T) {
			raw, err := os.ReadFile(filepath.Join(OutputDir, uid+".json"))
			if err != nil {
				t.Fatal(err)
			}
			var d dashboard.Dashboard //nolint:staticcheck // the classic model, as generated
			if err := strict(d.UnmarshalJSONStrict(raw)); err != nil {
				t.Fatalf("strict decode: %v", err)
			}
			// The SDK's strict decoder drops every panel: PanelOrRowPanel
			// returns its panel's typed-nil error before keeping it. So
			// each panel is decoded strictly on its own, and the whole
			// dashboard again with the SDK's ordinary decoder.
			var panels struct{ Panels []json.RawMessage }
			if err := json.Unmarshal(raw, &panels); err != nil {
				t.Fatal(err)
			}
			for i, p := range panels.Panels {
				var kind struct{ Type string }
				_ = json.Unmarshal(p, &kind)
				var err error
				if kind.Type == "row" {
					err = strict(new(dashboard.RowPanel).UnmarshalJSONStrict(p))
				} else {
					err = strict(new(dashboard.Panel).UnmarshalJSONStrict(p))
				}
				if err != nil {
					t.Errorf("panel %d: strict decode: %v", i, err)
				}
			}
			d = dashboard.Dashboard{} //nolint:staticcheck // the classic model, as generated
			if err := json.Unmarshal(raw, &d); err != nil {
				t.Fatal(err)
			}
			if len(d.Panels) != len(panels.Panels) {
				t.Fatalf("decoded %d panels of %d", len(d.Panels), len(panels.Panels))
			}
			if err := d.Validate(); err != nil {
				t.Fatalf("validate: %v", err)
			}
			if d.Uid == nil || *d.Uid != uid {
				t.Errorf("uid %v", d.Uid)
			}
			if d.SchemaVersion == 0 {
				t.Error("schemaVersion is not set")
			}
			if !slices.Contains(d.Tags, Tag) {
				t.Errorf("tags %v lack %s", d.Tags, Tag)
			}
			checkDashboard(t, d)
		})
	}
}

type rect struct{ x, y, w, h uint32 }

func (a rect) overlaps(b rect) bool {
	return a.x < b.x+b.w && b.x < a.x+a.w && a.y < b.y+b.h && b.y < a.y+a.h
}

func checkDashboard(t *testing.T, d dashboard.Dashboard) { //nolint:staticcheck // the classic model, as generated
	t.Helper()
	var dsType string
	vars := map[string]bool{}
	for _, v := range d.Templating.List {
		vars[v.Name] = true
		if v.Name == "datasource" {
			if v.Type != "datasource" || v.Query == nil || v.Query.String == nil {
				t.Fatalf("datasource variable %+v", v)
			}
			dsType = *v.Query.String
		}
	}
	if dsType == "" {
		t.Fatal("no datasource variable")
	}
	if dsType == PluginID {
		for _, name := range []string{"cluster", "namespace", "resource", "user"} {
			if !vars[name] {
				t.Errorf("no %s variable", name)
			}
		}
	}
	checkRef := func(where string, typ, uid *string) {
		if typ == nil || uid == nil || *typ != dsType || *uid != "${datasource}" {
			t.Errorf("%s: datasource %v/%v, want %s/${datasource}", where, deref(typ), deref(uid), dsType)
		}
	}
	for _, v := range d.Templating.List {
		if v.Type == "query" {
			if v.Datasource == nil {
				t.Errorf("variable %s has no datasource", v.Name)
				continue
			}
			checkRef("variable "+v.Name, v.Datasource.Type, v.Datasource.Uid)
		}
	}
	ids := map[uint32]bool{}
	ownQuery := map[uint32]bool{}
	var placed []rect
	for _, p := range d.Panels {
		var id uint32
		var pos *dashboard.GridPos
		switch {
		case p.Panel != nil:
			if p.Panel.Id == nil {
				t.Errorf("panel %q has no id", deref(p.Panel.Title))
				continue
			}
			id, pos = *p.Panel.Id, p.Panel.GridPos
			if shared, ok := sharedQuery(p.Panel); ok {
				// A panel on "-- Dashboard --" shows an earlier panel's
				// results: one that runs its own query.
				if !ownQuery[shared] {
					t.Errorf("panel %d reuses panel %d, which runs no query of its own", id, shared)
				}
				break
			}
			if p.Panel.Datasource == nil {
				t.Errorf("panel %d has no datasource", id)
			} else {
				checkRef(fmt.Sprintf("panel %d", id), p.Panel.Datasource.Type, p.Panel.Datasource.Uid)
			}
			if len(p.Panel.Targets) == 0 {
				t.Errorf("panel %d has no target", id)
			}
			for _, target := range p.Panel.Targets {
				raw, _ := json.Marshal(target)
				var ref struct {
					Datasource struct{ Type, UID *string } `json:"datasource"`
				}
				_ = json.Unmarshal(raw, &ref)
				checkRef(fmt.Sprintf("panel %d target", id), ref.Datasource.Type, ref.Datasource.UID)
				if dsType == PluginID {
					if _, ok := target.(*ClickHouseQuery); !ok {
						t.Errorf("panel %d: target decoded as %T, not the ClickHouse query", id, target)
					}
				}
			}
			ownQuery[id] = true
		case p.RowPanel != nil:
			id, pos = p.RowPanel.Id, p.RowPanel.GridPos
		}
		if ids[id] {
			t.Errorf("panel id %d twice", id)
		}
		ids[id] = true
		if pos == nil || pos.W == 0 || pos.H == 0 || pos.X+pos.W > 24 {
			t.Errorf("panel %d: gridPos %+v", id, pos)
			continue
		}
		r := rect{pos.X, pos.Y, pos.W, pos.H}
		for _, o := range placed {
			if r.overlaps(o) {
				t.Errorf("panel %d at %+v overlaps %+v", id, r, o)
			}
		}
		placed = append(placed, r)
	}
}

// sharedQuery is the panel whose results p shows through the
// "-- Dashboard --" data source, if p is on it.
func sharedQuery(p *dashboard.Panel) (uint32, bool) {
	if p.Datasource == nil || deref(p.Datasource.Uid) != DashboardDatasource || deref(p.Datasource.Type) != "datasource" || len(p.Targets) != 1 {
		return 0, false
	}
	q, ok := p.Targets[0].(*datasource.Dataquery)
	if !ok {
		return 0, false
	}
	return q.PanelId, true
}

func deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}

var exprRef = regexp.MustCompile(`\$([A-Z])\b`)

// TestAlertRulesStructure decodes the committed provisioning file: its
// envelope strictly, and each rule strictly into the SDK's alerting.Rule,
// validated; each condition and expression names a refId of its rule.
func TestAlertRulesStructure(t *testing.T) {
	registerVariants()
	js := committedRules(t)
	var file struct {
		APIVersion int `json:"apiVersion"`
		Groups     []struct {
			OrgID    int64             `json:"orgId"`
			Name     string            `json:"name"`
			Folder   string            `json:"folder"`
			Interval string            `json:"interval"`
			Rules    []json.RawMessage `json:"rules"`
		} `json:"groups"`
		DeleteRules []RuleDeletion `json:"deleteRules"`
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&file); err != nil {
		t.Fatalf("provisioning file: %v", err)
	}
	if file.APIVersion != 1 || len(file.Groups) != 1 {
		t.Fatalf("apiVersion %d, %d groups", file.APIVersion, len(file.Groups))
	}
	grp := file.Groups[0]
	if grp.Folder == "" || grp.Name == "" || grp.Interval == "" || grp.OrgID != 1 {
		t.Errorf("group %+v", grp)
	}
	uids := map[string]bool{}
	for i, rawRule := range grp.Rules {
		// The file's rules take orgID, folderUID and ruleGroup from their
		// group; the SDK's Rule holds them on each rule.
		var fields map[string]any
		if err := json.Unmarshal(rawRule, &fields); err != nil {
			t.Fatal(err)
		}
		fields["orgID"], fields["folderUID"], fields["ruleGroup"] = grp.OrgID, grp.Folder, grp.Name
		// dashboardUid and panelId are the file format's (Grafana sets
		// the rule's __dashboardUid__ and __panelId__ from them), not
		// the SDK's: each must name a panel of a generated dashboard.
		dash, _ := fields["dashboardUid"].(string)
		panel, _ := fields["panelId"].(float64)
		if !panelExists(t, dash, int(panel)) {
			t.Errorf("rule %d (%v): dashboardUid %q panelId %v is no generated panel", i, fields["title"], dash, panel)
		}
		delete(fields, "dashboardUid")
		delete(fields, "panelId")
		rawRule, _ = json.Marshal(fields)
		var r alerting.Rule
		if err := strict(r.UnmarshalJSONStrict(rawRule)); err != nil {
			t.Errorf("rule %d: strict decode: %v", i, err)
			continue
		}
		// As for panels, the SDK's strict decoder loses a model behind a
		// typed-nil error: decode each model strictly on its own, then the
		// rule with the ordinary decoder.
		var data struct {
			Data []struct{ Model json.RawMessage }
		}
		_ = json.Unmarshal(rawRule, &data)
		for j, d := range data.Data {
			m, err := cog.StrictUnmarshalDataquery(d.Model, "")
			if err := strict(err); err != nil {
				t.Errorf("rule %q: data %d: strict decode of the model: %v", r.Title, j, err)
			}
			if _, unknown := m.(variants.UnknownDataquery); unknown {
				t.Errorf("rule %q: data %d: the model's datasource type is unknown to the SDK", r.Title, j)
			}
		}
		r = alerting.Rule{}
		if err := json.Unmarshal(rawRule, &r); err != nil {
			t.Fatal(err)
		}
		if err := r.Validate(); err != nil {
			t.Errorf("rule %q: validate: %v", r.Title, err)
		}
		if r.Uid == nil || uids[*r.Uid] {
			t.Errorf("rule %q: uid %v missing or repeated", r.Title, r.Uid)
		} else {
			uids[*r.Uid] = true
		}
		refs := map[string]bool{}
		for _, q := range r.Data {
			refs[deref(q.RefId)] = true
		}
		if !refs[r.Condition] {
			t.Errorf("rule %q: condition %s is none of its refIds %v", r.Title, r.Condition, refs)
		}
		if r.For == "" || r.Annotations["runbook_url"] == "" || r.Annotations["summary"] == "" {
			t.Errorf("rule %q: for %q, annotations %v", r.Title, r.For, r.Annotations)
		}
		for _, q := range r.Data {
			if deref(q.DatasourceUid) == "__expr__" {
				m, _ := json.Marshal(q.Model)
				var e struct{ Expression string }
				_ = json.Unmarshal(m, &e)
				for _, ref := range exprRef.FindAllStringSubmatch(e.Expression, -1) {
					if !refs[ref[1]] {
						t.Errorf("rule %q: expression %s refers to %s, not a refId", r.Title, deref(q.RefId), ref[1])
					}
				}
				if e.Expression == "" {
					t.Errorf("rule %q: expression %s is empty", r.Title, deref(q.RefId))
				}
				continue
			}
			if q.RelativeTimeRange == nil || q.RelativeTimeRange.From == nil || *q.RelativeTimeRange.From <= 0 {
				t.Errorf("rule %q: query %s has no relative time range", r.Title, deref(q.RefId))
			}
		}
	}
	// Six: the sink's insert lag pages from the chart's PrometheusRule.
	if len(uids) != 6 {
		t.Errorf("%d rules, want 6", len(uids))
	}
	if uids["stampguard-sink-insert-lag"] {
		t.Error("a Grafana insert-lag rule pages beside the chart's AuditsinkInsertLag")
	}
}

// committedRules is the committed alert provisioning file, as JSON.
func committedRules(t *testing.T) []byte {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(OutputDir, AlertRulesFile))
	if err != nil {
		t.Fatal(err)
	}
	js, err := yaml.YAMLToJSON(raw)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// TestUpgradeDeletesTheRetiredRules reads the committed provisioning file:
// it deletes every rule UID that files before the per-cluster UIDs
// provisioned, in org 1, and no UID that a file generated now for any of
// several clusters provisions.
func TestUpgradeDeletesTheRetiredRules(t *testing.T) {
	js := committedRules(t)
	var file struct {
		DeleteRules []RuleDeletion `json:"deleteRules"`
	}
	if err := json.Unmarshal(js, &file); err != nil {
		t.Fatal(err)
	}
	deleted := map[string]bool{}
	for _, d := range file.DeleteRules {
		if d.OrgID != 1 || d.UID == "" {
			t.Errorf("deleteRules entry %+v, want orgId 1 and a uid", d)
		}
		deleted[d.UID] = true
	}
	// The first generated file's UIDs (commit 01d7363), and the Grafana
	// insert-lag rule that the chart's AuditsinkInsertLag replaced.
	for _, uid := range []string{"stampguard-conflict-storm", "stampguard-climbing-conflicts", "stampguard-stale-retry-loop",
		"stampguard-audited-stampless-writes", "stampguard-sink-insert-lag", "stampguard-sink-spool-growth"} {
		if !deleted[uid] {
			t.Errorf("the file does not delete the retired rule %s", uid)
		}
	}
	for _, cluster := range []string{"", "default", "prod", "staging", "stampguard"} {
		g, err := Generate(Options{Alerts: AlertOptions{Cluster: cluster}})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range g.Rules.Rules {
			if deleted[*r.Uid] {
				t.Errorf("cluster %q: the file deletes the current rule %s (%s)", cluster, *r.Uid, r.Title)
			}
		}
	}
}

// panelExists says whether the committed dashboard uid has a panel id.
func panelExists(t *testing.T, uid string, id int) bool {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(OutputDir, uid+".json"))
	if err != nil {
		return false
	}
	var d struct{ Panels []struct{ ID int } }
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatal(err)
	}
	for _, p := range d.Panels {
		if p.ID == id {
			return true
		}
	}
	return false
}

// TestRuleFilesForTwoClustersProvisionSideBySide generates the rules for
// -cluster prod and -cluster staging: no rule UID and no group is in both
// (Grafana's provisioning would refuse or overwrite them), and every rule
// carries its cluster as a label.
func TestRuleFilesForTwoClustersProvisionSideBySide(t *testing.T) {
	uids := map[string]string{}
	groups := map[string]string{}
	for _, cluster := range []string{"prod", "staging"} {
		g, err := Generate(Options{Alerts: AlertOptions{Cluster: cluster}})
		if err != nil {
			t.Fatal(err)
		}
		p := g.Rules.Provisioning()
		for _, grp := range p.Groups {
			if c, ok := groups[grp.Name+"/"+grp.Folder]; ok {
				t.Errorf("group %s in folder %s for both %s and %s", grp.Name, grp.Folder, c, cluster)
			}
			groups[grp.Name+"/"+grp.Folder] = cluster
			for _, r := range grp.Rules {
				if c, ok := uids[r.UID]; ok {
					t.Errorf("rule %q: UID %s for both %s and %s", r.Title, r.UID, c, cluster)
				}
				uids[r.UID] = cluster
				if len(r.UID) > 40 {
					t.Errorf("rule %q: UID %s is longer than Grafana's 40 characters", r.Title, r.UID)
				}
				if r.Labels["cluster"] != cluster {
					t.Errorf("rule %q: labels %v, want cluster %s", r.Title, r.Labels, cluster)
				}
				if r.DashboardUID == "" || r.PanelID == 0 {
					t.Errorf("rule %q links to no panel", r.Title)
				}
			}
		}
	}
	if len(uids) != 12 {
		t.Errorf("%d rule UIDs over two clusters, want 12", len(uids))
	}
}

// TestImportsNoDriver keeps the generator (and analytics/sql under it)
// free of the ClickHouse driver, the spool and the log reader.
func TestImportsNoDriver(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, dep := range strings.Fields(string(out)) {
		switch {
		case strings.HasPrefix(dep, "github.com/ClickHouse/"),
			dep == "github.com/stampguard/stampguard/analytics",
			strings.HasPrefix(dep, "github.com/stampguard/stampguard/analytics/pipeline"),
			strings.HasPrefix(dep, "github.com/stampguard/stampguard/analytics/store"),
			strings.HasPrefix(dep, "github.com/stampguard/stampguard/analytics/spool"),
			strings.HasPrefix(dep, "github.com/stampguard/stampguard/internal/logfile"):
			t.Errorf("dashboards depends on %s", dep)
		}
	}
	if !strings.Contains(string(out), "github.com/stampguard/stampguard/analytics/sql") {
		t.Error("dashboards does not use analytics/sql")
	}
}

// TestEveryQueryExpands expands every query for one selection of the
// variables: no placeholder, parameter or macro is left.
func TestEveryQueryExpands(t *testing.T) {
	g, _ := generated(t)
	e := asql.Expansion{From: time.Unix(1700000000, 0), To: time.Unix(1700003600, 0), Interval: time.Minute,
		Vars: map[string][]string{"cluster": {"c"}, "namespace": {"a", "b"}, "name": {""}, "verb": {"update"}, "hide_system": {"yes"}}, All: map[string]bool{"resource": true, "user": true, "code": true}}
	sqls, err := g.Expanded(e)
	if err != nil {
		t.Fatal(err)
	}
	if len(sqls) != len(g.Queries) || len(sqls) < 40 {
		t.Fatalf("%d expansions of %d queries", len(sqls), len(g.Queries))
	}
	left := regexp.MustCompile(`@[a-z_]+|\{[a-z_]+\}|\$__|\$\{`)
	for name, sql := range sqls {
		if m := left.FindString(sql); m != "" {
			t.Errorf("%s: %s left over", name, m)
		}
	}
}

// TestRunbooksExist requires the README section each rule's runbook_url
// points at.
func TestRunbooksExist(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]bool{}
	for _, line := range strings.Split(string(readme), "\n") {
		if h, ok := strings.CutPrefix(line, "### "); ok {
			a := strings.ToLower(h)
			a = regexp.MustCompile(`[^a-z0-9 -]`).ReplaceAllString(a, "")
			anchors[strings.ReplaceAll(a, " ", "-")] = true
		}
	}
	g, _ := generated(t)
	for _, r := range g.Rules.Rules {
		anchor, ok := strings.CutPrefix(r.Annotations["runbook_url"], RunbookBase)
		if !ok || !anchors[anchor] {
			t.Errorf("rule %q: runbook %q is no README section", r.Title, r.Annotations["runbook_url"])
		}
	}
}

func TestGenerateRefusesBadOptions(t *testing.T) {
	for name, c := range map[string]struct {
		o    Options
		want string
	}{
		"a database name that would need quoting":      {Options{Database: "prod; DROP"}, `database name "prod; DROP"`},
		"a storm rate of 20 (percent, not a fraction)": {Options{Alerts: AlertOptions{StormRate: 20}}, "conflict rates are fractions"},
	} {
		if _, err := Generate(c.o); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", name, err, c.want)
		}
	}
}

var metricRef = regexp.MustCompile(`\b(?:stampguard|auditsink)_[a-z_]+`)

// TestMetricsExist requires every metric the health dashboard and the
// sink's rules query to be one the binaries register (a string literal in
// their non-test sources); a histogram's series end in _bucket.
func TestMetricsExist(t *testing.T) {
	registered := map[string]bool{}
	for _, dir := range []string{"../analytics", "../policy", "../cmd"} {
		err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			b, err := os.ReadFile(path)
			for _, m := range regexp.MustCompile(`"((?:stampguard|auditsink)_[a-z_]+)"`).FindAllStringSubmatch(string(b), -1) {
				registered[m[1]] = true
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	_, files := generated(t)
	used := 0
	for name, b := range files {
		for _, m := range metricRef.FindAllString(string(b), -1) {
			used++
			if !registered[strings.TrimSuffix(m, "_bucket")] {
				t.Errorf("%s queries %s, which no binary registers", name, m)
			}
		}
	}
	if used < 10 {
		t.Errorf("only %d metric references found", used)
	}
}

// TestPanelsSayWhereTheRequestFiltersDoNotApply requires of every panel of
// the ClickHouse dashboards that the verb and code variables narrow its
// statement, or that its description says they do not (RequestFiltersNote):
// no filter silently does nothing.
func TestPanelsSayWhereTheRequestFiltersDoNotApply(t *testing.T) {
	g, files := generated(t)
	statements := map[string]asql.Statement{}
	for _, q := range g.Queries {
		if parts := strings.Split(q.Name, "/"); len(parts) == 3 && regexp.MustCompile(`^[0-9]+$`).MatchString(parts[1]) {
			statements[parts[0]+"/"+parts[1]] = q.Statement
		}
	}
	narrowed, noted := 0, 0
	for _, uid := range []string{UIDConflicts, UIDHotObjects, UIDPolicy, UIDLeases} {
		var d struct {
			Panels []struct {
				ID          int
				Type        string
				Title       string
				Description string
				Targets     []struct {
					PanelID int `json:"panelId"`
				}
			}
		}
		if err := json.Unmarshal(files[uid+".json"], &d); err != nil {
			t.Fatal(err)
		}
		for _, p := range d.Panels {
			if p.Type == "row" {
				continue
			}
			s, ok := statements[fmt.Sprintf("%s/%d", uid, p.ID)]
			if !ok && len(p.Targets) == 1 { // a panel showing another's results
				s, ok = statements[fmt.Sprintf("%s/%d", uid, p.Targets[0].PanelID)]
			}
			if !ok {
				t.Errorf("%s panel %d %q: no statement", uid, p.ID, p.Title)
				continue
			}
			takes := slices.Contains(s.Params, asql.Verb) && slices.Contains(s.Params, asql.Code)
			says := strings.HasSuffix(p.Description, RequestFiltersNote)
			switch {
			case takes && says:
				t.Errorf("%s panel %q: the verb and code filters narrow %s, but the description says they do not apply", uid, p.Title, s.Name)
			case !takes && !says:
				t.Errorf("%s panel %q: the verb and code filters do not narrow %s, and the description does not say so", uid, p.Title, s.Name)
			case takes:
				narrowed++
			default:
				noted++
			}
		}
	}
	if narrowed < 5 || noted < 5 {
		t.Errorf("%d panels narrowed by verb and code, %d that say they are not", narrowed, noted)
	}
}
