package record

import (
	"reflect"
	"slices"
	"testing"

	"github.com/stampguard/stampguard/internal/audit"
)

// TestRowLayoutNamesRowFields checks the record layout's tables: each
// offset is a string (or list) field of audit.Row, every such field a
// column stores is in the layout exactly once, and each goes to its own
// column of a matching type.
func TestRowLayoutNamesRowFields(t *testing.T) {
	rt := reflect.TypeFor[audit.Row]()
	byOffset := map[uintptr]reflect.StructField{}
	// The string fields no record carries: Cluster is the record's, and no
	// column stores what only replay reads (the impersonated user's groups
	// and the request and response bodies, which Raw holds redacted).
	notInRecord := map[string]bool{"Cluster": true, "ImpersonatedGroups": true, "RequestObject": true, "ResponseObject": true}
	want := map[string]bool{}
	for i := range rt.NumField() {
		f := rt.Field(i)
		byOffset[f.Offset] = f
		if (f.Type.Kind() == reflect.String || f.Type == reflect.TypeFor[[]string]()) && !notInRecord[f.Name] {
			want[f.Name] = true
		}
	}
	seen, cols := map[string]bool{}, map[int]bool{}
	check := func(fields []rowField, typ reflect.Type, colTypes ...string) {
		for _, lf := range fields {
			f, ok := byOffset[lf.off]
			switch {
			case !ok:
				t.Errorf("offset %d is no field of audit.Row", lf.off)
				continue
			case f.Type != typ:
				t.Errorf("%s is a %s, the layout reads a %s", f.Name, f.Type, typ)
			case seen[f.Name]:
				t.Errorf("%s is in the layout twice", f.Name)
			case cols[lf.col]:
				t.Errorf("%s goes to column %d, which another field fills", f.Name, lf.col)
			}
			if ct := columnTable[lf.col].typ; !slices.Contains(colTypes, ct) {
				t.Errorf("%s goes to a column of type %s, want one of %q", f.Name, ct, colTypes)
			}
			seen[f.Name], cols[lf.col] = true, true
		}
	}
	check(rowStringFields[:], reflect.TypeFor[string](), "String", lcString)
	check(rowListFields[:], reflect.TypeFor[[]string](), "Array(String)")
	for name := range want {
		if !seen[name] {
			t.Errorf("audit.Row.%s is not in the record layout", name)
		}
	}
}
