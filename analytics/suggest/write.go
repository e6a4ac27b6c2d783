package suggest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"unicode"

	"github.com/stampguard/stampguard/policy/api/v1alpha1"
)

// Header is what the output's first comment says of the history.
type Header struct {
	// Since and Until bound the history read, as the report writes them.
	Since, Until string
	// Source names the history: the files, or a server's database.
	Source  string
	Options Options
	// NotReplayed, when set, says why the drafts were not replayed.
	NotReplayed string
}

// Write writes the drafts as YAML documents that `kubectl apply -f`
// takes as they are, each rule preceded by its evidence and what its
// replay found, as comments. The same drafts and header give the same
// bytes.
func Write(w io.Writer, h Header, drafts []Draft) error {
	var b bytes.Buffer
	o := h.Options
	fmt.Fprintf(&b, "# ConcurrencyPolicy drafts by `auditsink suggest` from the audit history\n")
	fmt.Fprintf(&b, "# of %s to %s (%s).\n", h.Since, h.Until, comment(h.Source))
	b.WriteString("# Every draft is in Audit mode: apply it, watch its decisions (`auditsink\n" +
		"# report`, policy decisions), then set `action: Deny`. docs/suggest.md\n" +
		"# says how each rule is inferred.\n")
	fmt.Fprintf(&b, "# Thresholds: owner share %s, min changes %d, min writes %d, min lost\n# updates %d, min reuses %d; immutable paths %s.\n",
		strconv.FormatFloat(o.OwnerShare, 'f', -1, 64), o.MinChanges, o.MinWrites, o.MinLostUpdates, o.MinReuses, comment(strings.Join(o.ImmutablePaths, ", ")))
	if h.NotReplayed != "" {
		fmt.Fprintf(&b, "# Not replayed: %s.\n", comment(h.NotReplayed))
	} else {
		b.WriteString("# Each rule was replayed over the same history with `webhook replay`'s\n" +
			"# engine: \"would refuse\" is what it would have refused under Deny.\n")
	}
	if len(drafts) == 0 {
		b.WriteString("# The history supports no draft at these thresholds.\n")
	}
	for i := range drafts {
		writeDraft(&b, &drafts[i])
	}
	_, err := w.Write(b.Bytes())
	return err
}

func writeDraft(b *bytes.Buffer, d *Draft) {
	p := d.Policy()
	fmt.Fprintf(b, "---\n# %s in namespace %s\n", comment(d.Kind.ResourceName()), comment(d.Kind.Namespace))
	fmt.Fprintf(b, "apiVersion: %s\nkind: %s\nmetadata:\n  name: %s\nspec:\n  action: %s\n", p.APIVersion, p.Kind, q(p.Name), p.Spec.Action)
	fmt.Fprintf(b, "  match:\n    resources:\n    - group: %s\n      resource: %s\n    namespaces:\n    - %s\n",
		q(d.Kind.APIGroup), q(d.Kind.Resource), q(d.Kind.Namespace))
	if s := d.Stamp; s != nil {
		e := s.Example
		lines(b, "  ", fmt.Sprintf("%d lost updates by stampless updates of %s, %s to %s; they erased the changes of %s. The first: %s of %s/%s by %s over %s's change (audit ID %s).",
			s.Lost, tally(s.Writers), s.First, s.Last, tally(s.Overwritten), e.Field, e.Namespace, e.Name, e.Writer, e.OverwrittenWriter, e.AuditID), s.Replay)
		b.WriteString("  requireResourceVersion: true\n")
	}
	if r := d.Delete; r != nil {
		lines(b, "  ", fmt.Sprintf("%d names (%d times) deleted by %s and created again by another writer (%s), %s to %s: a delete by name reaches whichever object holds the name.",
			r.Names, r.Reuses, strings.Join(r.Deleters, ", "), strings.Join(r.Creators, ", "), r.First, r.Last), r.Replay)
		fmt.Fprintf(b, "  requireDeletePreconditions: %s\n", v1alpha1.DeletePreconditionUID)
	}
	if len(d.Owners) > 0 {
		b.WriteString("  fieldOwners:\n")
	}
	for i, o := range d.Owners {
		ev := fmt.Sprintf("%s made %d of the %d changes (on %s), %s to %s", o.Owner, o.Changes, o.Total, plural(o.Objects, "object"), o.First, o.Last)
		if len(o.Others) > 0 {
			ev += "; the others: " + tally(o.Others)
		}
		if o.Lost > 0 {
			ev += fmt.Sprintf("; %d of theirs were lost updates", o.Lost)
		}
		lines(b, "  ", ev+".", o.Replay)
		fmt.Fprintf(b, "  - path: %s\n    writers:\n", q(o.Path))
		wr := p.Spec.FieldOwners[i].Writers
		for _, l := range []struct {
			key  string
			vals []string
		}{{"serviceAccounts", wr.ServiceAccounts}, {"users", wr.Users}} {
			if len(l.vals) > 0 {
				fmt.Fprintf(b, "      %s:\n      - %s\n", l.key, q(l.vals[0]))
			}
		}
	}
	if len(d.Immutable) > 0 {
		b.WriteString("  immutableFields:\n")
	}
	for _, f := range d.Immutable {
		ev := fmt.Sprintf("never changed: on %s (of %d seen whole) through %s, %d of them creations, %s to %s",
			plural(f.Objects, "object"), f.KindObjects, plural(f.Versions, "version"), f.Created, f.First, f.Last)
		if f.Mode == v1alpha1.ImmutableOnceSet {
			ev += "; OnceSet, as some objects lack it and may still set it once"
		}
		lines(b, "  ", ev+".", f.Replay)
		fmt.Fprintf(b, "  - path: %s\n    mode: %s\n", q(f.Path), f.Mode)
	}
}

// lines writes a rule's evidence and its replay as comments, wrapped.
func lines(b *bytes.Buffer, indent, evidence string, r Replayed) {
	text := comment(evidence)
	if r.Done {
		text += " Replay: " + r.String()
	}
	width := 76 - len(indent)
	line := ""
	for _, word := range strings.Fields(text) {
		if line != "" && len(line)+1+len(word) > width {
			fmt.Fprintf(b, "%s# %s\n", indent, line)
			line = ""
		}
		if line != "" {
			line += " "
		}
		line += word
	}
	if line != "" {
		fmt.Fprintf(b, "%s# %s\n", indent, line)
	}
}

// String says what a replay found, in a sentence.
func (r Replayed) String() string {
	s := "would refuse " + plural(r.Refused, "write")
	if len(r.Writers) > 0 {
		s += " (" + tally(r.Writers) + ")"
	}
	if r.Undecidable == 0 {
		return s + "; none undecidable."
	}
	reasons := make([]string, len(r.Reasons))
	for i, c := range r.Reasons {
		reasons[i] = strconv.FormatUint(c.Count, 10) + " as " + c.Writer
	}
	return s + fmt.Sprintf("; %d undecidable: %s.", r.Undecidable, strings.Join(reasons, "; "))
}

// plural writes "1 write", "2 writes".
func plural(n uint64, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return strconv.FormatUint(n, 10) + " " + noun + "s"
}

// tally writes counts as "a 3, b 1".
func tally(ws []WriterCount) string {
	if len(ws) == 0 {
		return "nobody"
	}
	parts := make([]string, len(ws))
	for i, w := range ws {
		parts[i] = w.Writer + " " + strconv.FormatUint(w.Count, 10)
	}
	return strings.Join(parts, ", ")
}

// q quotes a string as a YAML double-quoted scalar (JSON's escapes are
// YAML's).
func q(s string) string {
	out, _ := json.Marshal(s)
	return string(out)
}

// comment makes text safe inside a comment: no line breaks or other
// control characters (a writer's name comes from the log).
func comment(s string) string {
	return strings.Map(func(r rune) rune {
		if unicode.IsControl(r) || r == '\u2028' || r == '\u2029' {
			return ' '
		}
		return r
	}, s)
}
