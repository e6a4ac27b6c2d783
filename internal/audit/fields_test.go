package audit_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/stampguard/stampguard/internal/audit"
	"github.com/stampguard/stampguard/internal/rawjson"
	"github.com/stampguard/stampguard/policy"
)

// deployment is a Deployment as the apiserver stores it (trimmed).
const deployment = `{"kind":"Deployment","apiVersion":"apps/v1",
 "metadata":{"name":"web","namespace":"shop","uid":"u-1","resourceVersion":"4711","generation":3,
  "creationTimestamp":"2026-12-01T10:00:00Z",
  "labels":{"app":"web","team":"blue"},
  "annotations":{"deployment.kubernetes.io/revision":"2","kubectl.kubernetes.io/last-applied-configuration":"{...}"},
  "finalizers":["example.com/protect","b.io/x"],
  "managedFields":[{"manager":"kubectl","operation":"Update"}]},
 "spec":{"replicas":3,"paused":false,
  "selector":{"matchLabels":{"app":"web"}},
  "template":{"metadata":{"labels":{"app":"web"}},
   "spec":{"containers":[{"name":"app","image":"nginx:1.27","env":[{"name":"MODE","value":"fast"},{"name":"LOG","value":""}],
     "ports":[{"containerPort":80,"protocol":"TCP"}]}],
    "tolerations":[],"nodeSelector":{}}}},
 "status":{"replicas":3}}`

func TestObjectFieldsNameEveryFieldInThePolicyPathSyntax(t *testing.T) {
	h := audit.NewFieldHasher([]byte("k"))
	var f audit.Fields
	if err := h.Object(deployment, false, &f); err != nil {
		t.Fatal(err)
	}
	want := []string{
		`metadata.labels.app`, `metadata.labels.team`,
		`metadata.annotations["deployment.kubernetes.io/revision"]`,
		`metadata.finalizers[*]`, `metadata.finalizers[*]`,
		`spec.replicas`, `spec.paused`, `spec.selector.matchLabels.app`,
		`spec.template.metadata.labels.app`,
		`spec.template.spec.containers[name=app].name`,
		`spec.template.spec.containers[name=app].image`,
		`spec.template.spec.containers[name=app].env[name=MODE].name`,
		`spec.template.spec.containers[name=app].env[name=MODE].value`,
		`spec.template.spec.containers[name=app].env[name=LOG].name`,
		`spec.template.spec.containers[name=app].env[name=LOG].value`,
		`spec.template.spec.containers[name=app].ports[*]`,
	}
	if !slices.Equal(f.Paths, want) {
		t.Fatalf("paths\n got %q\nwant %q", f.Paths, want)
	}
	// Every path parses as a rule path and selects the value it hashed
	// (an item of a set-like list among the others).
	doc := []byte(deployment)
	for i, p := range f.Paths {
		fp, err := policy.ParseFieldPath(p)
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		vals, err := fp.Values(doc, nil)
		if err != nil || len(vals) == 0 {
			t.Fatalf("%s selects %d values (%v)", p, len(vals), err)
		}
		var hashes []uint64
		for _, v := range vals {
			hashes = append(hashes, h.Sum(rawjson.Trim(v)))
		}
		if !slices.Contains(hashes, f.Hashes[i]) {
			t.Errorf("%s: hash %x is none of the selected value's %x", p, f.Hashes[i], hashes)
		}
	}
}

func TestObjectFieldsHashValuesUnderTheKey(t *testing.T) {
	a, b := audit.NewFieldHasher([]byte("one")), audit.NewFieldHasher([]byte("two"))
	var fa, fb, fa2 audit.Fields
	if err := a.Object(deployment, false, &fa); err != nil {
		t.Fatal(err)
	}
	if err := b.Object(deployment, false, &fb); err != nil {
		t.Fatal(err)
	}
	changed := strings.Replace(deployment, `"replicas":3,"paused"`, `"replicas":5,"paused"`, 1)
	if err := a.Object(changed, false, &fa2); err != nil {
		t.Fatal(err)
	}
	for i, p := range fa.Paths {
		if fa.Hashes[i] == fb.Hashes[i] {
			t.Errorf("%s hashes alike under two keys", p)
		}
		if (fa.Hashes[i] != fa2.Hashes[i]) != (p == "spec.replicas") {
			t.Errorf("%s: hash %x then %x after a change of spec.replicas only", p, fa.Hashes[i], fa2.Hashes[i])
		}
	}
	// Short values of every length hash apart.
	seen := map[uint64]string{}
	for n := range 40 {
		for _, c := range []string{"a", "b"} {
			v := strings.Repeat("x", n) + c
			s := a.Sum([]byte(v))
			if o, dup := seen[s]; dup {
				t.Fatalf("%q and %q hash alike", o, v)
			}
			seen[s] = v
		}
	}
}

func TestObjectFieldsOfAScaleAreItsReplicas(t *testing.T) {
	h := audit.NewFieldHasher(nil)
	var f, d audit.Fields
	scale := `{"kind":"Scale","apiVersion":"autoscaling/v1","metadata":{"name":"web","resourceVersion":"9"},"spec":{"replicas":3},"status":{"replicas":2,"selector":"app=web"}}`
	if err := h.Object(scale, true, &f); err != nil {
		t.Fatal(err)
	}
	if err := h.Object(deployment, false, &d); err != nil {
		t.Fatal(err)
	}
	i := slices.Index(d.Paths, "spec.replicas")
	if !slices.Equal(f.Paths, []string{"spec.replicas"}) || f.Hashes[0] != d.Hashes[i] {
		t.Errorf("scale fields %q %x, the deployment's spec.replicas %x", f.Paths, f.Hashes, d.Hashes[i])
	}
}

func TestObjectFieldsQuoteWhatIsNoFieldName(t *testing.T) {
	h := audit.NewFieldHasher(nil)
	var f audit.Fields
	obj := `{"metadata":{"labels":{"a b":"1","q\"uote":"2"}},"data":{"mode.conf":"x"},"spec":{"items":[{"name":"x y"},{"name":"z]"}]}}`
	if err := h.Object(obj, false, &f); err != nil {
		t.Fatal(err)
	}
	for _, p := range f.Paths {
		if _, err := policy.ParseFieldPath(p); err != nil {
			t.Errorf("%s: %v", p, err)
		}
	}
	want := []string{`metadata.labels["a b"]`, `metadata.labels["q\"uote"]`, `data["mode.conf"]`, `spec.items[name="x y"].name`, `spec.items[name="z]"].name`}
	if !slices.Equal(f.Paths, want) {
		t.Errorf("paths\n got %q\nwant %q", f.Paths, want)
	}
}

func TestObjectFieldsRefuseWhatIsTooBig(t *testing.T) {
	h := audit.NewFieldHasher(nil)
	var f audit.Fields
	var b strings.Builder
	b.WriteString(`{"data":{`)
	for i := range audit.MaxFields + 1 {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `"k%d":"v"`, i)
	}
	b.WriteString(`}}`)
	if err := h.Object(b.String(), false, &f); !errors.Is(err, audit.ErrTooManyFields) || len(f.Paths) != 0 {
		t.Errorf("%d fields: %v, %d paths kept", audit.MaxFields+1, err, len(f.Paths))
	}
	deep := `{"spec":` + strings.Repeat(`{"a":`, 40) + `1` + strings.Repeat(`}`, 40) + `}`
	if err := h.Object(deep, false, &f); !errors.Is(err, audit.ErrTooManyFields) {
		t.Errorf("40 levels deep: %v", err)
	}
	if err := h.Object(`{"spec":[1,}`, false, &f); err == nil {
		t.Error("a broken object gave no error")
	}
}

func TestObjectVersionOrdersDecimalStampsOnly(t *testing.T) {
	for rv, want := range map[string]uint64{"4711": 4711, "": 0, "0": 0, "012": 0, "abc": 0, "18446744073709551615": 1<<64 - 1, "18446744073709551616": 0, "1e3": 0} {
		if got := audit.ObjectVersion(rv); got != want {
			t.Errorf("ObjectVersion(%q) = %d, want %d", rv, got, want)
		}
	}
}

// FuzzObjectFields: any object gives fields or an error, never a panic;
// the same object gives the same fields; every path parses as a rule path.
func FuzzObjectFields(f *testing.F) {
	f.Add(deployment, false)
	f.Add(`{"spec":{"replicas":2}}`, true)
	f.Add(`{"metadata":{"labels":{"a b":"1"}},"spec":{"l":[{"name":"a"},{"name":"a"}]}}`, false)
	f.Add(`{"data":{"\u00e9":"\ud800"}}`, false)
	h := audit.NewFieldHasher([]byte("fuzz"))
	f.Fuzz(func(t *testing.T, obj string, scale bool) {
		var a, b audit.Fields
		errA := h.Object(obj, scale, &a)
		errB := h.Object(obj, scale, &b)
		if (errA == nil) != (errB == nil) || !slices.Equal(a.Paths, b.Paths) || !slices.Equal(a.Hashes, b.Hashes) {
			t.Fatalf("two walks of one object differ: %v %q / %v %q", errA, a.Paths, errB, b.Paths)
		}
		if errA != nil {
			if len(a.Paths) != 0 {
				t.Fatalf("error %v with %d paths", errA, len(a.Paths))
			}
			return
		}
		if !json.Valid([]byte(obj)) && !strings.ContainsFunc(obj, func(r rune) bool { return r < 0x20 }) {
			// rawjson lets raw control characters pass inside strings;
			// nothing else encoding/json refuses.
			t.Fatalf("fields of invalid JSON %q", obj)
		}
		for _, p := range a.Paths {
			if _, err := policy.ParseFieldPath(p); err != nil {
				t.Fatalf("path %q: %v", p, err)
			}
		}
	})
}

// TestDecoderFillsTheFieldHistoryOfSuccessfulWrites: the history of a
// write is read from its bodies and URI; a write without a response, a
// dry run, a failure or a redacted kind has none.
func TestDecoderFillsTheFieldHistoryOfSuccessfulWrites(t *testing.T) {
	h := audit.NewFieldHasher([]byte("k"))
	d := audit.Decoder{History: &h}
	event := func(verb, uri, sub, resource string, code int, req, resp string) string {
		return `{"auditID":"a","stage":"ResponseComplete","level":"RequestResponse","verb":"` + verb + `","requestURI":"` + uri +
			`","stageTimestamp":"2026-12-01T10:00:00.000001Z","objectRef":{"resource":"` + resource + `","namespace":"shop","name":"web","subresource":"` + sub +
			`"},"responseStatus":{"code":` + fmt.Sprint(code) + `},"requestObject":` + req + `,"responseObject":` + resp + `}`
	}
	withManaged := `{"metadata":{"name":"web","resourceVersion":"4711","managedFields":[{"manager":"m"}]},"spec":{"replicas":3}}`
	var r audit.Row
	for _, c := range []struct {
		name, ev                     string
		version                      uint64
		full, managed, force, fields bool
	}{
		{"update", event("update", "/apis/apps/v1/namespaces/shop/deployments/web", "", "deployments", 200, withManaged, deployment), 4711, true, true, false, true},
		{"forced apply", event("patch", "/apis/apps/v1/namespaces/shop/deployments/web?fieldManager=ci&force=true", "", "deployments", 200, `{"spec":{}}`, deployment), 4711, true, false, true, true},
		{"apply", event("patch", "/apis/apps/v1/namespaces/shop/deployments/web?fieldManager=ci&force=false", "", "deployments", 200, `{"spec":{}}`, deployment), 4711, true, false, false, true},
		{"scale", event("patch", "/apis/apps/v1/namespaces/shop/deployments/web/scale", "scale", "deployments", 200, `{"spec":{"replicas":2}}`, `{"kind":"Scale","metadata":{"resourceVersion":"12"},"spec":{"replicas":2}}`), 12, false, false, false, true},
		{"dry run", event("update", "/apis/apps/v1/namespaces/shop/deployments/web?dryRun=All", "", "deployments", 200, withManaged, deployment), 0, false, false, false, false},
		{"conflict", event("update", "/apis/apps/v1/namespaces/shop/deployments/web", "", "deployments", 409, withManaged, `{"kind":"Status","code":409}`), 0, false, false, false, false},
		{"secret", event("update", "/api/v1/namespaces/shop/secrets/web", "", "secrets", 200, withManaged, deployment), 0, false, false, false, false},
		{"eviction", event("create", "/api/v1/namespaces/shop/pods/web/eviction", "eviction", "pods", 201, `{}`, deployment), 0, false, false, false, false},
	} {
		if err := d.Decode(c.ev, &r); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if r.ObjectVersion != c.version || r.FullView != c.full || r.RequestManaged != c.managed || r.Force != c.force || (len(r.Fields.Paths) > 0) != c.fields {
			t.Errorf("%s: version %d full %v managed %v force %v, %d fields; want %d %v %v %v fields %v",
				c.name, r.ObjectVersion, r.FullView, r.RequestManaged, r.Force, len(r.Fields.Paths), c.version, c.full, c.managed, c.force, c.fields)
		}
	}
}
