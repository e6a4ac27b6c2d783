package report

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// WriteJSON writes the report as the documented JSON contract.
func WriteJSON(w io.Writer, r *Report) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// tableWidth is the terminal width the table fits in.
const tableWidth = 100

// WriteTable writes a terminal report, most urgent findings first: lost
// updates, field fights, unresolved retry loops, hot objects, conflicts by
// writer and resource and who caused them, stampless writers, writes that
// stored nothing, the writers of each field, lease churn, stampguard
// decisions.
func WriteTable(w io.Writer, r *Report, o Options) error {
	p := &printer{w: w}
	scope := "cluster " + quoteEmpty(o.Cluster)
	for _, f := range [][2]string{{"namespace", o.Namespace}, {"resource", o.Resource}, {"user", o.User}} {
		if f[1] != "" {
			scope += ", " + f[0] + " " + f[1]
		}
	}
	p.line("stampguard conflict report: %s", scope)
	p.line("window %s .. %s (%s, UTC)", r.Window.Since, r.Window.Until, o.Until.Sub(o.Since).Round(time.Second))
	t := r.Totals
	if t.Requests == 0 {
		p.line("")
		p.line("No requests were recorded in this window, so there is nothing to report.")
		p.line("Check --cluster (events are stored per source cluster), the window, and that the")
		p.line("audit sink is receiving events (auditsink serve / ingest / tail).")
		return p.err
	}
	p.line("")
	p.line("requests %d   write attempts %d   version conflicts %d   conflict rate %.2f%%",
		t.Requests, t.WriteAttempts, t.VersionConflicts, 100*t.ConflictRate)
	p.line("field conflicts %d   already exists %d   delete precondition conflicts %d   other 409s %d",
		t.FieldConflicts, t.AlreadyExists, t.DeletePreconditionConflicts, t.OtherConflicts)
	p.line("stampless updates %d   gone (410) %d", t.StamplessUpdates, t.Gone)

	var rows [][]string
	for _, l := range r.LostUpdates {
		rows = append(rows, []string{object(l.APIGroup, l.Resource, l.Namespace, l.Name) + " " + l.Field,
			l.OverwrittenWriter + " -> " + l.Writer, l.Cause, shortTime(l.Time)})
	}
	p.table("LOST UPDATES (a change overwritten by a writer that had not seen it)", "none",
		[]string{"OBJECT FIELD", "OVERWRITTEN -> BY", "CAUSE", "AT"}, []int{50, 22, 15, 14}, rows)

	rows = nil
	for _, f := range r.FieldFights {
		rows = append(rows, []string{object(f.APIGroup, f.Resource, f.Namespace, f.Name) + " " + f.Field,
			strings.Join(f.Writers, ", "), fmt.Sprint(f.Changes), fmt.Sprint(f.Handoffs)})
	}
	p.table("FIELD FIGHTS (fields changing hands between writers)", "none",
		[]string{"OBJECT FIELD", "WRITERS", "CHANGES", "HANDOFFS"}, []int{46, 32, 7, 8}, rows)

	var unresolved, resolved []RetryLoop
	for _, l := range r.RetryLoops {
		if l.Resolved {
			resolved = append(resolved, l)
		} else {
			unresolved = append(unresolved, l)
		}
	}
	loopRows := func(ls []RetryLoop) [][]string {
		var rows [][]string
		for _, l := range ls {
			rows = append(rows, []string{l.User, object(l.APIGroup, l.Resource, l.Namespace, l.Name), fmt.Sprint(l.Conflicts), shortTime(l.First), shortTime(l.Last)})
		}
		return rows
	}
	p.table("UNRESOLVED RETRY LOOPS (writers still failing on a stale stamp)", "none: every run of conflicts ended in a success",
		[]string{"WRITER", "OBJECT", "CONFLICTS", "FIRST", "LAST"}, []int{18, 32, 9, 14, 14}, loopRows(unresolved))
	if len(resolved) > 0 {
		p.table("RESOLVED RETRY LOOPS", "", []string{"WRITER", "OBJECT", "CONFLICTS", "FIRST", "LAST"}, []int{18, 32, 9, 14, 14}, loopRows(resolved))
	}

	rows = nil
	for _, h := range r.HotObjects {
		rows = append(rows, []string{object(h.APIGroup, h.Resource, h.Namespace, h.Name), fmt.Sprint(h.VersionConflicts), fmt.Sprint(h.DistinctWriters), fmt.Sprint(h.WriteAttempts)})
	}
	p.table("HOT OBJECTS", "none", []string{"OBJECT", "CONFLICTS", "WRITERS", "ATTEMPTS"}, []int{62, 9, 7, 8}, rows)

	rows = nil
	for _, u := range r.ConflictsByUser {
		rows = append(rows, []string{u.User, fmt.Sprint(u.VersionConflicts), fmt.Sprint(u.WriteAttempts), rate(u.VersionConflicts, u.WriteAttempts)})
	}
	p.table("VERSION CONFLICTS BY WRITER", "none", []string{"WRITER", "CONFLICTS", "ATTEMPTS", "RATE"}, []int{62, 9, 8, 6}, rows)

	rows = nil
	for _, c := range r.ConflictsByResource {
		rows = append(rows, []string{groupResource(c.APIGroup, c.Resource), fmt.Sprint(c.VersionConflicts), fmt.Sprint(c.WriteAttempts), rate(c.VersionConflicts, c.WriteAttempts)})
	}
	p.table("VERSION CONFLICTS BY RESOURCE", "none", []string{"RESOURCE", "CONFLICTS", "ATTEMPTS", "RATE"}, []int{62, 9, 8, 6}, rows)

	rows = nil
	for _, c := range r.ConflictCauses {
		by := c.BlockedBy
		if by == "" {
			by = "(not in the field history)"
		}
		rows = append(rows, []string{c.Writer, by, fmt.Sprint(c.Conflicts)})
	}
	p.table("WHO CAUSED THE VERSION CONFLICTS", "none", []string{"WRITER", "BLOCKED BY", "CONFLICTS"}, []int{40, 40, 9}, rows)

	rows = nil
	for _, s := range r.StamplessUpdates {
		rows = append(rows, []string{s.User, object(s.APIGroup, s.Resource, s.Namespace, s.Name), fmt.Sprint(s.Count)})
	}
	p.table("STAMPLESS UPDATES (blind overwrites that succeeded)", "none", []string{"WRITER", "OBJECT", "UPDATES"}, []int{30, 52, 7}, rows)

	rows = nil
	for _, n := range r.NoopWrites {
		rows = append(rows, []string{n.User, fmt.Sprint(n.Count)})
	}
	p.table("WRITES THAT STORED NOTHING (the same state sent again)", "none", []string{"WRITER", "WRITES"}, []int{70, 9}, rows)

	rows = nil
	for _, f := range r.FieldWriters {
		kind := groupResource(f.APIGroup, f.Resource)
		if f.Namespace != "" {
			kind += " in " + f.Namespace
		}
		rows = append(rows, []string{kind + " " + f.Field, f.Writer, fmt.Sprint(f.Changes), fmt.Sprint(f.Objects)})
	}
	p.table("FIELD WRITERS (who changes which field, busiest first)", "none",
		[]string{"KIND FIELD", "WRITER", "CHANGES", "OBJECTS"}, []int{46, 30, 7, 7}, rows)

	rows = nil
	for _, l := range r.LeaseHolderChanges {
		rows = append(rows, []string{l.Namespace + "/" + l.Name, fmt.Sprint(l.Changes), strings.Join(l.Holders, " -> ")})
	}
	p.table("LEASE HOLDER CHANGES", "none", []string{"LEASE", "CHANGES", "HOLDERS"}, []int{36, 7, 48}, rows)

	rows = nil
	for _, d := range r.PolicyDecisions {
		rows = append(rows, []string{d.Policy, d.Kind, d.Action, fmt.Sprint(d.Count)})
	}
	p.table("STAMPGUARD POLICY DECISIONS (audit = would have denied)", "none recorded", []string{"POLICY", "RULE", "ACTION", "COUNT"}, []int{40, 20, 8, 10}, rows)
	return p.err
}

type printer struct {
	w   io.Writer
	err error
}

func (p *printer) line(format string, args ...any) {
	if p.err != nil {
		return
	}
	_, p.err = fmt.Fprintf(p.w, format+"\n", args...)
}

func (p *printer) table(title, empty string, header []string, widths []int, rows [][]string) {
	p.line("")
	p.line("%s", title)
	if len(rows) == 0 {
		p.line("  %s", empty)
		return
	}
	if p.err != nil {
		return
	}
	for i, h := range header {
		header[i] = clip(h, widths[i])
	}
	tw := tabwriter.NewWriter(p.w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  "+strings.Join(header, "\t"))
	for _, r := range rows {
		cells := make([]string, len(r))
		for i, c := range r {
			cells[i] = clip(c, widths[i])
		}
		fmt.Fprintln(tw, "  "+strings.Join(cells, "\t"))
	}
	p.err = tw.Flush()
}

// clip keeps long names from pushing a table past the terminal width; it
// keeps both ends, since object names differ at the end as often as at
// the start.
func clip(s string, n int) string {
	if len(s) <= n || n < 8 {
		return s
	}
	head := (n - 3) / 2
	return s[:head] + "..." + s[len(s)-(n-3-head):]
}

func object(group, resource, ns, name string) string {
	s := groupResource(group, resource) + " "
	if ns != "" {
		s += ns + "/"
	}
	return s + name
}

func groupResource(group, resource string) string {
	if group == "" {
		return resource
	}
	return resource + "." + group
}

func rate(conflicts, attempts uint64) string {
	if attempts == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f%%", 100*float64(conflicts)/float64(attempts))
}

func quoteEmpty(s string) string {
	if s == "" {
		return `""`
	}
	return s
}

// shortTime is a table cell's instant: month, day and time to the second,
// UTC (the header gives the window's full dates).
func shortTime(s string) string {
	t, err := time.Parse(TimeFormat, s)
	if err != nil {
		return s
	}
	return t.Format("01-02 15:04:05")
}
