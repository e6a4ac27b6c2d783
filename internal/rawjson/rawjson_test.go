package rawjson

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestSkip(t *testing.T) {
	cases := []struct {
		name string
		in   string
		end  int // -1: error
	}{
		{"a string with an escaped quote ends at its real closing quote", `"a\"b" ,`, 6},
		{"a string ending in an escaped backslash ends at the next quote", `"a\\" ,`, 5},
		{"nested containers end at the matching bracket", `{"a":[1,{"b":"]"}]} x`, 19},
		{"a number ends before the comma", `-1.5e3,`, 6},
		{"literals are recognised", `true}`, 4},
		{"an unterminated string is an error", `"abc`, -1},
		{"mismatched brackets are an error", `{"a":[1}`, -1},
		{"an unterminated container is an error", `[1,2`, -1},
		{"a bare word is an error", `nope`, -1},
		{"empty input is an error", `   `, -1},
		{"nesting as deep as the apiserver allows is read", strings.Repeat("[", 10000) + strings.Repeat("]", 10000), 20000},
		{"nesting deeper than the apiserver allows is an error", strings.Repeat("[", 10001) + strings.Repeat("]", 10001), -1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			end, err := Skip([]byte(c.in), 0)
			if c.end < 0 {
				if !errors.Is(err, ErrSyntax) {
					t.Fatalf("want ErrSyntax, got end %d err %v", end, err)
				}
				return
			}
			if err != nil || end != c.end {
				t.Fatalf("got end %d err %v, want %d", end, err, c.end)
			}
		})
	}
}

func TestMemberAndEach(t *testing.T) {
	doc := []byte(` { "a" : 1 , "b\u0063" : {"x": [ "p", "q" ]}, "n": null } `)
	v, ok, err := Member(doc, "bc")
	if err != nil || !ok || string(v) != `{"x": [ "p", "q" ]}` {
		t.Fatalf("escaped key: got %q %v %v", v, ok, err)
	}
	x, _, _ := Member(v, "x")
	got, err := Strings(x)
	if err != nil || len(got) != 2 || got[0] != "p" || got[1] != "q" {
		t.Fatalf("Strings: %q %v", got, err)
	}
	if _, ok, _ := Member(doc, "missing"); ok {
		t.Fatal("found a missing member")
	}
	n, ok, _ := Member(doc, "n")
	if !ok || !IsNull(n) {
		t.Fatalf("null member: %q %v", n, ok)
	}
	if _, _, err := Member([]byte(`[1]`), "a"); !errors.Is(err, ErrSyntax) {
		t.Fatalf("an array has no members: want ErrSyntax, got %v", err)
	}
	if err := ObjectEach([]byte(`{"a" 1}`), func(_, _ []byte) bool { return true }); !errors.Is(err, ErrSyntax) {
		t.Fatalf("missing colon: want ErrSyntax, got %v", err)
	}
}

func TestEqual(t *testing.T) {
	cases := []struct {
		name string
		a, b string
		want bool
	}{
		{"identical bytes are equal", `{"a":1}`, `{"a":1}`, true},
		{"member order does not matter", `{"a":1,"b":2}`, `{"b":2, "a":1}`, true},
		{"numbers compare by value", `1.0`, `1`, true},
		{"absent equals null", ``, `null`, true},
		{"a string is not a number", `"1"`, `1`, false},
		{"list order matters", `[1,2]`, `[2,1]`, false},
		{"a changed nested value differs", `{"a":{"b":1}}`, `{"a":{"b":2}}`, false},
		{"escapes decode before comparing", `"\u0061"`, `"a"`, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := Equal([]byte(c.a), []byte(c.b)); got != c.want {
				t.Fatalf("Equal(%s, %s) = %v", c.a, c.b, got)
			}
		})
	}
}

// FuzzSkip checks Skip against encoding/json: it never panics, accepts every
// valid document whole, and every member it hands out is itself skippable.
func FuzzSkip(f *testing.F) {
	for _, s := range []string{`{"a":[1,"x\"y",{"b":null}]}`, `"\\"`, `[`, `{"a":}`, `-0.5e+3`, `[[[[]]]]`, `{"k":"v","k":"w"}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		end, err := Skip(data, 0)
		// Skip validates what it skips as the Scanner does: it accepts
		// nothing encoding/json refuses, but raw control characters in
		// strings, which the audit sink passes through (inputs with any
		// byte below 0x20, whitespace included, are left out here).
		if err == nil && !bytes.ContainsFunc(data[:end], func(r rune) bool { return r < 0x20 }) &&
			!json.Valid(data[:end]) {
			t.Fatalf("Skip accepts %q, encoding/json does not", data[:end])
		}
		if json.Valid(data) {
			if err != nil {
				t.Fatalf("valid JSON %q refused: %v", data, err)
			}
			if len(Trim(data[end:])) != 0 {
				t.Fatalf("valid JSON %q: Skip stopped at %d", data, end)
			}
		}
		if Kind(data) == '{' {
			_ = ObjectEach(data, func(k, v []byte) bool {
				if _, err := Skip(v, 0); err != nil {
					t.Fatalf("member %q of %q not skippable: %v", v, data, err)
				}
				// Unquote decodes as encoding/json does, for valid UTF-8.
				if u, err := Unquote(k); err == nil && utf8.Valid(k) && !bytes.ContainsFunc(k, func(r rune) bool { return r < 0x20 }) {
					var want string
					if jerr := json.Unmarshal(k, &want); jerr != nil || want != u {
						t.Fatalf("Unquote(%q) = %q, encoding/json %q (%v)", k, u, want, jerr)
					}
				}
				return true
			})
		}
		_ = Equal(data, data)
	})
}

// FuzzAppendString checks the hand-written string encoder against
// encoding/json: what it writes decodes back to the same string.
func FuzzAppendString(f *testing.F) {
	for _, s := range []string{"", "plain", "q\"b\\n\n\t\r\x00\x1f<&>", "ü€"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if !utf8.ValidString(s) {
			return // encoding/json would replace invalid bytes; policies hold valid UTF-8
		}
		out := AppendString(nil, s)
		var back string
		if err := json.Unmarshal(out, &back); err != nil || back != s {
			t.Fatalf("%q encoded as %s decodes to %q, %v", s, out, back, err)
		}
	})
}
