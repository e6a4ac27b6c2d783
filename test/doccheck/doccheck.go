// Package doccheck keeps the documentation true to the code: it finds the
// command lines of a binary in the Markdown files (code blocks and code
// spans), so that each binary's tests parse them against its real flags,
// and it finds the figures of the README's performance statements, so that
// a test can look for each in BENCHMARKS.md.
package doccheck

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// Docs are the files whose command lines are checked, relative to the
// repository root.
var Docs = []string{"README.md", "docs/*.md", "charts/stampguard/README.md"}

// Invocation is one command line of a binary in a document.
type Invocation struct {
	File string
	Line int
	// Text is the command line as written.
	Text string
	// Args follow the binary's name, up to a pipe, redirection or comment.
	Args []string
	// Synopsis is set for a flag listed under a usage line ("webhook
	// [flags]" then "  --port 9443  ..."): only the flag's name is in Args.
	Synopsis bool
}

func (i Invocation) String() string { return fmt.Sprintf("%s:%d: %s", i.File, i.Line, i.Text) }

// Invocations are the command lines of bin (its base name, e.g.
// "auditsink") in Docs under root.
func Invocations(t testing.TB, root, bin string) []Invocation {
	t.Helper()
	var out []Invocation
	for _, pattern := range Docs {
		files, err := filepath.Glob(filepath.Join(root, pattern))
		if err != nil || len(files) == 0 {
			t.Fatalf("no document matches %s under %s (%v)", pattern, root, err)
		}
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			rel, _ := filepath.Rel(root, f)
			out = append(out, scan(rel, string(b), bin)...)
		}
	}
	return out
}

var (
	codeSpan = regexp.MustCompile("`([^`]+)`")
	usageRE  = regexp.MustCompile(`^\s*(\S+(?: [a-z]+)?) \[flags\]`)
	flagLine = regexp.MustCompile(`^\s+(--[a-z][-a-z0-9]*)`)
)

// scan finds bin's command lines in one Markdown document.
func scan(file, doc, bin string) []Invocation {
	var out []Invocation
	lines := strings.Split(doc, "\n")
	inBlock := false
	synopsis := false // under "bin [flags]" in a code block
	var synopsisCmd []string
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		n := i + 1
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			inBlock, synopsis = !inBlock, false
			continue
		}
		if !inBlock {
			for _, m := range codeSpan.FindAllStringSubmatch(line, -1) {
				out = append(out, commands(file, n, m[1], bin)...)
			}
			continue
		}
		// A backslash at the end continues the command line.
		for strings.HasSuffix(line, `\`) && i+1 < len(lines) {
			i++
			line = strings.TrimSuffix(line, `\`) + " " + strings.TrimSpace(lines[i])
		}
		if m := usageRE.FindStringSubmatch(line); m != nil && firstWord(m[1]) == bin {
			synopsis, synopsisCmd = true, strings.Fields(m[1])[1:]
			continue
		}
		if synopsis {
			if m := flagLine.FindStringSubmatch(line); m != nil {
				out = append(out, Invocation{File: file, Line: n, Text: strings.TrimSpace(line),
					Args: append(append([]string{}, synopsisCmd...), m[1]), Synopsis: true})
				continue
			}
			if strings.TrimSpace(line) == "" || !strings.HasPrefix(line, " ") {
				synopsis = false
			} else {
				continue // a description's continuation line
			}
		}
		out = append(out, commands(file, n, line, bin)...)
	}
	return out
}

func firstWord(s string) string { return filepath.Base(strings.Fields(s)[0]) }

// commands finds bin's command lines in one line of shell.
func commands(file string, n int, line, bin string) []Invocation {
	var out []Invocation
	words := split(line)
	for i := 0; i < len(words); i++ {
		w := words[i]
		if filepath.Base(w) != bin || !atCommand(words, i) {
			continue
		}
		var args []string
		j := i + 1
		for ; j < len(words) && !isSeparator(words[j]); j++ {
			args = append(args, words[j])
		}
		out = append(out, Invocation{File: file, Line: n, Text: strings.TrimSpace(line), Args: args})
		i = j
	}
	return out
}

// atCommand reports whether words[i] is where a command starts: first,
// after a prompt, environment assignments or a shell separator.
func atCommand(words []string, i int) bool {
	for j := i - 1; j >= 0; j-- {
		w := words[j]
		switch {
		case isSeparator(w), w == "$", w == "==>", w == "sudo":
			return true
		case strings.Contains(w, "=") && !strings.HasPrefix(w, "-"):
			continue // VAR=value
		default:
			return false
		}
	}
	return true
}

func isSeparator(w string) bool {
	switch w {
	case "|", "||", "&&", ";", ">", ">>", "2>", "2>&1", "&":
		return true
	}
	return strings.HasPrefix(w, "#")
}

// split cuts a line of shell into words: quotes group, and are removed.
func split(line string) []string {
	var words []string
	var cur strings.Builder
	inWord := false
	var quote rune
	for _, r := range line {
		switch {
		case quote != 0:
			if r == quote {
				quote = 0
			} else {
				cur.WriteRune(r)
			}
		case r == '\'' || r == '"':
			quote, inWord = r, true
		case r == ' ' || r == '\t':
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words
}

// placeholder is a value a document leaves to the reader: NAME, FILE...,
// $VAR, <x>, a range of choices (Fail|Ignore) or an ellipsis.
var placeholder = regexp.MustCompile(`^([A-Z][A-Z0-9_.]*|.*\$.*|<.*>|.*\|.*|.*\.\.\.|\[.*\])$`)

// Parse checks args against fs the way fs.Parse would, flag by flag: each
// flag must be defined, and each value that is not a placeholder is set
// (a value naming a file that does not exist here is let through). It
// returns the operands, for the caller to count.
func Parse(fs *flag.FlagSet, args []string) (operands []string, err error) {
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			return append(operands, args[i+1:]...), nil
		}
		if !strings.HasPrefix(a, "-") || a == "-" {
			if a != "[flags]" {
				operands = append(operands, a)
			}
			continue
		}
		name, value, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		f := fs.Lookup(name)
		if f == nil {
			return nil, fmt.Errorf("flag --%s is not defined", name)
		}
		if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() && !hasValue {
			continue
		}
		if !hasValue {
			if i+1 >= len(args) {
				return operands, nil // prose naming the flag: `tail --metrics-listen`
			}
			i++
			value = args[i]
		}
		if placeholder.MatchString(value) {
			continue
		}
		if err := fs.Set(name, value); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("--%s %q: %w", name, value, err)
		}
	}
	return operands, nil
}

// Figures are the performance statements of a Markdown document: the
// sentences with a performance unit (ms, µs, events/s, MiB, %) in the
// paragraphs and list items that cite BENCHMARKS.md, outside code blocks.
// Each comes with its figures: a number or a hyphenated range, with its
// unit when it has one ("107,000-152,000 events/s", "400,000", "18.16").
func Figures(t testing.TB, path string) map[string][]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var paras []string
	var cur strings.Builder
	inBlock := false
	sc := bufio.NewScanner(f)
	flush := func() {
		if cur.Len() > 0 {
			paras = append(paras, cur.String())
			cur.Reset()
		}
	}
	for sc.Scan() {
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(trimmed, "```"):
			inBlock = !inBlock
			flush()
		case inBlock:
		case trimmed == "", strings.HasPrefix(trimmed, "- "), strings.HasPrefix(trimmed, "#"), strings.HasPrefix(trimmed, "|"):
			flush()
			cur.WriteString(strings.TrimPrefix(trimmed, "- "))
		default:
			cur.WriteString(" " + trimmed)
		}
	}
	flush()
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for _, p := range paras {
		if !strings.Contains(p, "BENCHMARKS.md") {
			continue
		}
		for _, s := range sentence.FindAllString(p, -1) {
			if perfUnit.MatchString(s) {
				out[strings.TrimSpace(s)] = number.FindAllString(s, -1)
			}
		}
	}
	return out
}

var (
	sentence = regexp.MustCompile(`(?s).+?(?:\.\s|\.$|$)`)
	perfUnit = regexp.MustCompile(`\d\s?(ms|µs|events/s|MiB|%)`)
	// A figure: a number (1,500, 0.45, 18.16) or a range
	// (107,000-152,000), with its unit when it has one.
	number = regexp.MustCompile(`\d[\d,]*(?:\.\d+)?(?:-\d[\d,]*(?:\.\d+)?)?(?:\s?(?:ms|µs|events/s|MiB|%))?`)
)

// Check parses inv's arguments (after any subcommand, which the caller
// has taken off into args) against fs: a synopsis line's flag must be
// defined; a command line must parse and have at most maxOperands
// operands (-1: any number).
func Check(fs *flag.FlagSet, inv Invocation, args []string, maxOperands int) error {
	if inv.Synopsis {
		for _, a := range args {
			if name := strings.TrimLeft(a, "-"); fs.Lookup(name) == nil {
				return fmt.Errorf("flag --%s is not defined", name)
			}
		}
		return nil
	}
	ops, err := Parse(fs, args)
	if err != nil {
		return err
	}
	if maxOperands >= 0 && len(ops) > maxOperands {
		return fmt.Errorf("stray argument %q: the command takes at most %d", ops[maxOperands], maxOperands)
	}
	return nil
}
