package audit

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/decode.golden from the current decoder")

// goldenCorpus is real-shaped audit events and odd ones: escapes, unicode,
// nulls, missing fields, wrong types, huge values, broken JSON. Each is
// sent as the one item of an EventList body.
func goldenCorpus(t *testing.T) []struct{ name, event string } {
	ev := realEvents(t)
	const ts = `"stageTimestamp":"2026-11-29T08:50:48.123456Z"`
	min := func(extra string) string {
		return `{"auditID":"a-1","stage":"ResponseComplete",` + ts + extra + `}`
	}
	huge := strings.Repeat("x", 300<<10)
	deep := strings.Repeat(`{"a":`, 900) + "1" + strings.Repeat("}", 900)
	tooDeep := strings.Repeat(`[`, 10001) + strings.Repeat("]", 10001)
	cases := []struct{ name, event string }{}
	for i, e := range ev {
		cases = append(cases, struct{ name, event string }{fmt.Sprintf("real event %d", i), e})
	}
	add := func(name, event string) { cases = append(cases, struct{ name, event string }{name, event}) }
	add("the smallest row", min(""))
	add("pretty-printed with every kind of whitespace", "{\n\t\"auditID\" : \"a-1\" ,\r\n \"stage\":\t\"Panic\",\n"+ts+"\n}")
	add("escapes in kept strings", min(`,"verb":"up\"da\\te","requestURI":"/a\/b?fieldManager=x%20y&dryRun=All","userAgent":"tab\there\nnl\r\b\f"`))
	add("unicode escapes and raw UTF-8", min(`,"user":{"username":"J\u00fcrgen \ud83d\ude00 ünï","groups":["\u0041","日本"]}`))
	add("a lone surrogate becomes U+FFFD", min(`,"user":{"username":"\ud800x","groups":["\udc00"]}`))
	add("a surrogate followed by a non-surrogate escape", min(`,"verb":"\ud83d\u0041"`))
	add("a bad escape in a kept string", min(`,"verb":"\q"`))
	add("a bad \\u escape in a kept string", min(`,"verb":"\u12g4"`))
	add("a bad escape in a skipped object", min(`,"responseObject":{"a":"\x"}`))
	add("a bad \\u escape in a skipped object", min(`,"responseObject":{"a":"\u00"}`))
	add("raw control characters pass through", min(",\"verb\":\"a\x01b\",\"responseObject\":{\"a\":\"\x02\"}"))
	add("invalid UTF-8 passes through", min(",\"verb\":\"a\xffb\",\"requestObject\":{\"a\":\"\xfe\"}"))
	add("nulls everywhere", min(`,"level":null,"verb":null,"user":null,"impersonatedUser":null,"objectRef":null,"responseStatus":null,"sourceIPs":null,"requestReceivedTimestamp":null,"requestObject":null,"responseObject":null,"userAgent":null`))
	add("null inside the objects", min(`,"user":{"username":null,"groups":null},"objectRef":{"resource":null,"name":null},"responseStatus":{"code":null,"reason":null,"details":null}`))
	add("null causes and null cause fields", min(`,"responseStatus":{"code":409,"details":{"causes":null}}`))
	add("causes with nulls", min(`,"responseStatus":{"code":422,"details":{"causes":[null,{"reason":null,"field":"spec"},{"reason":"FieldValueInvalid","message":"m","field":null}]}}`))
	add("null annotations are an error", min(`,"annotations":null`))
	add("annotations kept, skipped and the authorization decision", min(`,"annotations":{"authorization.k8s.io/decision":"allow","authorization.k8s.io/reason":"RBAC","stampguard.io/writer":"ci","x.stampguard.io/field":"spec"}`))
	add("an annotation that is not a string", min(`,"annotations":{"stampguard.io/n":1}`))
	add("empty sourceIPs", min(`,"sourceIPs":[]`))
	add("several sourceIPs", min(`,"sourceIPs":["10.0.0.1","10.0.0.2","::1"]`))
	add("a null first sourceIP", min(`,"sourceIPs":[null,"10.0.0.2"]`))
	add("a sourceIP that is a number", min(`,"sourceIPs":[1]`))
	add("sourceIPs that are an object", min(`,"sourceIPs":{"a":"b"}`))
	add("many sourceIPs", min(`,"sourceIPs":["`+strings.Repeat(`1.2.3.4","`, 40)+`5.6.7.8"]`))
	add("impersonation", min(`,"user":{"username":"admin","groups":["system:masters"]},"impersonatedUser":{"username":"alice","groups":["devs"],"extra":{"k":["v"]}}`))
	add("a user that is a string", min(`,"user":"alice"`))
	add("missing auditID", `{"stage":"ResponseComplete",`+ts+`}`)
	add("empty auditID", `{"auditID":"","stage":"ResponseComplete",`+ts+`}`)
	add("missing stage", `{"auditID":"a",`+ts+`}`)
	add("missing stageTimestamp", `{"auditID":"a","stage":"Panic"}`)
	add("a number for the auditID", `{"auditID":7,"stage":"Panic",`+ts+`}`)
	add("repeated keys: the last wins", min(`,"verb":"get","verb":"update","objectRef":{"name":"a"},"objectRef":{"namespace":"n"}`))
	add("timestamps with an offset and without a fraction", `{"auditID":"a","stage":"Panic","stageTimestamp":"2026-11-29T10:50:48+02:00","requestReceivedTimestamp":"2026-11-29T08:50:47Z"}`)
	add("nine fraction digits", `{"auditID":"a","stage":"Panic","stageTimestamp":"2026-11-29T08:50:48.123456789Z","requestReceivedTimestamp":"2026-11-29T08:50:48.1Z"}`)
	add("an impossible date", `{"auditID":"a","stage":"Panic","stageTimestamp":"2026-02-31T08:50:48Z"}`)
	add("a bad requestReceivedTimestamp", min(`,"requestReceivedTimestamp":"soon"`))
	add("a timestamp before 1970", `{"auditID":"a","stage":"Panic","stageTimestamp":"1969-12-31T23:59:59.5Z"}`)
	add("codes: negative", min(`,"responseStatus":{"code":-1}`))
	add("codes: fractional", min(`,"responseStatus":{"code":4.5}`))
	add("codes: exponent", min(`,"responseStatus":{"code":4e2}`))
	add("codes: out of range", min(`,"responseStatus":{"code":99999999999}`))
	add("codes: the int32 edges", min(`,"responseStatus":{"code":-2147483648}`))
	add("codes: a string", min(`,"responseStatus":{"code":"409"}`))
	add("numbers of every shape in skipped values", min(`,"requestObject":{"a":[0,-0,1.5,-2e-3,1E+9,12345678901234567890]}`))
	add("a bad number in a skipped value", min(`,"requestObject":{"a":01}`))
	add("a leading zero then digits in a skipped value", min(`,"requestObject":{"a":[-]}`))
	add("literals in skipped values", min(`,"requestObject":{"a":[true,false,null]}`))
	add("a bad literal in a skipped value", min(`,"requestObject":{"a":nul}`))
	add("a lease renewal keeps its holder", min(`,"objectRef":{"resource":"leases","name":"l"},"requestObject":{"kind":"Lease","spec":{"holderIdentity":"node-\u0031","leaseDurationSeconds":40}}`))
	add("a lease whose holder is not a string", min(`,"objectRef":{"resource":"leases"},"requestObject":{"spec":{"holderIdentity":7}}`))
	add("a lease whose spec is null", min(`,"objectRef":{"resource":"leases"},"requestObject":{"spec":null}`))
	add("a lease whose requestObject is broken", min(`,"objectRef":{"resource":"leases"},"requestObject":{"spec":{"holderIdentity":"a"`))
	add("a holder on another resource is dropped", min(`,"objectRef":{"resource":"configmaps"},"requestObject":{"spec":{"holderIdentity":"a"}}`))
	add("a secret's objects are redacted", min(`,"objectRef":{"resource":"secrets"},"requestObject":{"data":{"k":"c2VjcmV0"}},"responseObject":{"data":{"k":"c2VjcmV0"}}`))
	add("a configmap's objects are redacted when configured", min(`,"objectRef":{"resource":"configmaps"},"requestObject":{"data":{"k":"v"}}`))
	add("the objects before the objectRef are redacted too", `{"requestObject":{"data":{"k":"v"}},"auditID":"a","stage":"Panic",`+ts+`,"objectRef":{"resource":"secrets"}}`)
	add("a dry run and a field manager", min(`,"requestURI":"/api/v1/namespaces/a/configmaps/b?dryRun=All&fieldManager=kubectl%2Dclient-side-apply&force=true"`))
	add("a field manager that does not unescape", min(`,"requestURI":"/x?fieldManager=a%zz"`))
	add("an empty dryRun is a dry run, as the apiserver reads it", min(`,"requestURI":"/x?dryRun=&fieldManager=m"`))
	add("a dryRun without a value is a dry run", min(`,"requestURI":"/x?fieldManager=m&dryRun"`))
	add("the first of two field managers counts, as the apiserver reads it", min(`,"requestURI":"/x?fieldManager=first&fieldManager=second"`))
	add("objects with white space before them", min(`,"requestObject": {"a":1} ,"responseObject":`+"\n\t"+`{"b":2}`))
	add("a huge message", min(`,"responseStatus":{"code":500,"message":"`+huge+`"}`))
	add("a huge skipped object", min(`,"responseObject":{"data":{"big":"`+huge+`"}}`))
	add("a huge escaped string", min(`,"verb":"`+strings.Repeat(`\"`, 100<<10)+`"`))
	add("deep nesting in a skipped value", min(`,"requestObject":`+deep))
	add("nesting deeper than the limit", min(`,"requestObject":`+tooDeep))
	add("an empty object", `{}`)
	add("empty containers", min(`,"user":{},"sourceIPs":[],"annotations":{},"requestObject":{"a":[],"b":{}}`))
	add("a truncated event", `{"auditID":"a","stage":"Panic",`+ts+`,"requestObject":{"a":[1,2`)
	add("a truncated string", `{"auditID":"a","stage":"Panic","verb":"upd`)
	add("a missing colon", `{"auditID" "a"}`)
	add("a missing comma", `{"auditID":"a" "stage":"Panic"}`)
	add("a trailing comma", min(`,`))
	add("a key that is not a string", `{auditID:"a"}`)
	add("a string item", `"an event"`)
	add("a number item", `42`)
	add("an array item", `[1,2]`)
	add("a null item", `null`)
	add("a bracket mismatch", min(`,"requestObject":{"a":[1}`)+`]`)
	return cases
}

// decodeBody reads body through a ListReader from chunks of chunk bytes
// (0: all at once) and decodes each item, with NextRow when onePass and
// else with Next and then Decode (the reference: how the sink decoded
// before NextRow), writing what each item became to out.
func decodeBody(out *strings.Builder, body string, chunk int, onePass bool) {
	var r io.Reader = strings.NewReader(body)
	if chunk > 0 {
		r = &chunkReader{r: r, n: chunk}
	}
	lr := NewListReader(r, 1<<20)
	defer lr.Release()
	d := Decoder{KeepRaw: true, RedactResources: []string{"configmaps"}}
	var row Row
	for i := 0; ; i++ {
		var it Item
		var err error
		if onePass {
			it, err = lr.NextRow(&d, &row)
		} else if it, err = lr.Next(); err == nil && it.Err == nil {
			it.Err = d.Decode(string(it.Raw), &row)
		}
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			fmt.Fprintf(out, "  read error: %v\n", err)
			return
		}
		if it.Err != nil {
			fmt.Fprintf(out, "  item %d: dead letter: %v; raw %s\n", i, it.Err, golden(string(it.Raw)))
			continue
		}
		fmt.Fprintf(out, "  item %d: %s\n", i, goldenRow(&row))
	}
}

type chunkReader struct {
	r io.Reader
	n int
}

func (c *chunkReader) Read(p []byte) (int, error) { return c.r.Read(p[:min(len(p), c.n)]) }

// golden prints s, or for a long s its length, its hash and its ends.
func golden(s string) string {
	if len(s) <= 200 {
		return fmt.Sprintf("%q", s)
	}
	return fmt.Sprintf("(%d bytes, fnv %016x, %q...%q)", len(s), fnvString(fnvOffset, s), s[:40], s[len(s)-40:])
}

func goldenList(l []string) string {
	parts := make([]string, len(l))
	for i, s := range l {
		parts[i] = golden(s)
	}
	return "[" + strings.Join(parts, " ") + "]"
}

func goldenRow(r *Row) string {
	var b strings.Builder
	for _, f := range []struct{ name, v string }{
		{"auditID", r.AuditID}, {"stage", r.Stage}, {"level", r.Level}, {"verb", r.Verb},
		{"requestURI", r.RequestURI}, {"user", r.User}, {"impersonatedUser", r.ImpersonatedUser},
		{"userAgent", r.UserAgent}, {"sourceIP", r.SourceIP}, {"apiGroup", r.APIGroup},
		{"apiVersion", r.APIVersion}, {"resource", r.Resource}, {"subresource", r.Subresource},
		{"namespace", r.Namespace}, {"name", r.Name}, {"uid", r.ObjectUID}, {"stamp", r.Stamp},
		{"fieldManager", r.FieldManager}, {"reason", r.Reason}, {"message", r.Message},
		{"authz", r.AuthzDecision}, {"leaseHolder", r.LeaseHolder},
		{"requestObject", r.RequestObject}, {"responseObject", r.ResponseObject}, {"raw", r.Raw},
	} {
		if f.v != "" {
			fmt.Fprintf(&b, "\n    %s=%s", f.name, golden(f.v))
		}
	}
	for _, f := range []struct {
		name string
		v    []string
	}{
		{"groups", r.UserGroups}, {"impersonatedGroups", r.ImpersonatedGroups}, {"causeReasons", r.CauseReasons}, {"causeFields", r.CauseFields},
		{"annotationKeys", r.AnnotationKeys}, {"annotationValues", r.AnnotationValues},
	} {
		if len(f.v) > 0 {
			fmt.Fprintf(&b, "\n    %s=%s", f.name, goldenList(f.v))
		}
	}
	fmt.Fprintf(&b, "\n    dryRun=%v code=%d received=%d stage=%d fingerprint=%016x",
		r.DryRun, r.Code, r.RequestReceivedMicros, r.StageMicros, r.Fingerprint)
	return "row" + b.String()
}

// goldenBodies are the EventList bodies of the golden test: each corpus
// event alone, then the real events 150 times over in one body (so that
// items straddle the reader's buffer ends).
func goldenBodies(t *testing.T) []struct{ name, body string } {
	var bodies []struct{ name, body string }
	for _, c := range goldenCorpus(t) {
		bodies = append(bodies, struct{ name, body string }{c.name, eventList(c.event)})
	}
	ev := realEvents(t)
	var many []string
	for i := range 150 {
		many = append(many, ev[i%len(ev)])
	}
	bodies = append(bodies, struct{ name, body string }{"150 real events in one body", eventList(many...)})
	return bodies
}

// TestDecodeGolden pins what every corpus event becomes (its row, field by
// field, or its dead letter's reason), decoded in one pass (NextRow) and
// in two (Next, then Decode), read whole and in 7-byte chunks: all four
// must give testdata/decode.golden, which the two-pass decoder wrote
// before NextRow existed. go test -run TestDecodeGolden -update rewrites
// it from the two-pass decoder.
func TestDecodeGolden(t *testing.T) {
	const path = "testdata/decode.golden"
	read := func(chunk int, onePass bool) string {
		var out strings.Builder
		for _, b := range goldenBodies(t) {
			fmt.Fprintf(&out, "## %s\n", b.name)
			decodeBody(&out, b.body, chunk, onePass)
		}
		return out.String()
	}
	if *update {
		if err := os.WriteFile(path, []byte(read(0, false)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name    string
		chunk   int
		onePass bool
	}{
		{"two passes, read whole", 0, false},
		{"two passes, read in 7-byte chunks", 7, false},
		{"one pass, read whole", 0, true},
		{"one pass, read in 7-byte chunks", 7, true},
	} {
		if got := read(c.chunk, c.onePass); got != string(want) {
			t.Errorf("%s: decoding differs from %s:\n%s", c.name, path, firstDiff(got, string(want)))
		}
	}
}

// firstDiff shows the first differing line of got and want.
func firstDiff(got, want string) string {
	g, w := strings.Split(got, "\n"), strings.Split(want, "\n")
	for i := range max(len(g), len(w)) {
		var gl, wl string
		if i < len(g) {
			gl = g[i]
		}
		if i < len(w) {
			wl = w[i]
		}
		if gl != wl {
			return fmt.Sprintf("line %d:\n got  %s\n want %s", i+1, gl, wl)
		}
	}
	return "(equal)"
}
