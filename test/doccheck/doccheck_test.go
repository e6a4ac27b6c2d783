package doccheck

import (
	"flag"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

func TestScanFindsCommandLines(t *testing.T) {
	doc := "Run `auditsink report --top 5` or `make build`.\n" +
		"```sh\n" +
		"export AUDITSINK_CLICKHOUSE_DSN=clickhouse://h:9000\n" +
		"$ AUDITSINK_TOKEN=x bin/auditsink serve --plaintext \\\n" +
		"    --listen :8080 | tee log   # a comment\n" +
		"echo auditsink ingest   # not a command: an argument of echo\n" +
		"auditsink [flags]\n" +
		"  --database NAME    the database\n" +
		"                     (continued)\n" +
		"  --log-level info   debug | info\n" +
		"\n" +
		"auditsink migrate --scan-days N\n" +
		"```\n"
	got := scan("doc.md", doc, "auditsink")
	var texts []string
	for _, inv := range got {
		texts = append(texts, strings.Join(inv.Args, " "))
	}
	want := []string{"report --top 5", "serve --plaintext --listen :8080", "--database", "--log-level", "migrate --scan-days N"}
	if !slices.Equal(texts, want) {
		t.Fatalf("found %q, want %q", texts, want)
	}
	if !got[2].Synopsis || got[1].Synopsis || got[1].Line != 4 {
		t.Errorf("synopsis or line numbers wrong: %+v", got)
	}
}

func TestParseNamesARenamedFlag(t *testing.T) {
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Int("top", 10, "")
	fs.Bool("keep-raw", false, "")
	fs.String("ca-bundle", "", "")
	tests := []struct {
		args []string
		err  string
		ops  []string
	}{
		{[]string{"--top", "5", "--keep-raw", "a.log"}, "", []string{"a.log"}},
		{[]string{"--top", "N", "FILE..."}, "", []string{"FILE..."}},
		{[]string{"--top=$TOP"}, "", nil},
		{[]string{"--rows", "5"}, "flag --rows is not defined", nil},
		{[]string{"--top", "five"}, `--top "five": `, nil},
		{[]string{"--top"}, "", nil}, // a flag named in prose
		{[]string{"--tops"}, "flag --tops is not defined", nil},
	}
	for _, tt := range tests {
		ops, err := Parse(fs, tt.args)
		if tt.err == "" && (err != nil || !slices.Equal(ops, tt.ops)) {
			t.Errorf("%q: %q %v, want %q", tt.args, ops, err, tt.ops)
		}
		if tt.err != "" && (err == nil || !strings.HasPrefix(err.Error(), tt.err)) {
			t.Errorf("%q: %v, want %q", tt.args, err, tt.err)
		}
	}
}

// Every figure the README's performance statements quote is one that
// BENCHMARKS.md reports: verbatim, with its unit (a range is one figure;
// "7 ms" is not "6.8-7.0 ms").
func TestREADMEFiguresAreInBENCHMARKS(t *testing.T) {
	root := filepath.Join("..", "..")
	b, err := os.ReadFile(filepath.Join(root, "BENCHMARKS.md"))
	if err != nil {
		t.Fatal(err)
	}
	bench := strings.ReplaceAll(string(b), "**", "")
	statements := Figures(t, filepath.Join(root, "README.md"))
	if len(statements) < 2 {
		t.Fatalf("found %d performance statements in README.md citing BENCHMARKS.md, want the latency and the sizing ones at least: %q", len(statements), statements)
	}
	for s, numbers := range statements {
		for _, n := range numbers {
			re := regexp.MustCompile(`(^|[^\d,.])` + strings.ReplaceAll(regexp.QuoteMeta(n), " ", `\s?`) + `($|[^\d,]|,\D)`)
			if !re.MatchString(bench) {
				t.Errorf("README.md quotes %s, which BENCHMARKS.md does not hold, in: %q", n, s)
			}
		}
	}
}

func TestFiguresReadTheCitingParagraphsOnly(t *testing.T) {
	p := filepath.Join(t.TempDir(), "r.md")
	doc := "- **Sizing.** It stores 107,000-152,000 events/s. It waits 1 s\n  (BENCHMARKS.md).\n\n" +
		"A rule fires above 256 MiB.\n\n```\nstores 9 ms (BENCHMARKS.md)\n```\n"
	if err := os.WriteFile(p, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	got := Figures(t, p)
	if len(got) != 1 || !slices.Equal(got["**Sizing.** It stores 107,000-152,000 events/s."], []string{"107,000-152,000 events/s"}) {
		t.Errorf("figures %q", got)
	}
}
