package workload

import (
	"io"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"
)

// apiserver is a hand-written fake of the apiserver's answer, enough for
// the recorder: a status code, an Audit-Id and a body.
type apiserver struct {
	code int
	body string
	got  string // the request body that reached the server
}

func (f *apiserver) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body != nil {
		b, _ := io.ReadAll(req.Body)
		f.got = string(b)
	}
	h := http.Header{}
	h.Set("Audit-Id", "id-1")
	return &http.Response{StatusCode: f.code, Header: h, Body: io.NopCloser(strings.NewReader(f.body)), Request: req}, nil
}

func TestRecorder(t *testing.T) {
	for _, c := range []struct {
		name, method, url, body string
		code                    int
		respBody                string
		want                    Request
	}{
		{
			name: "a stale update records its stamp and the conflict", method: "PUT",
			url:  "/api/v1/namespaces/ns/configmaps/x",
			body: `{"metadata":{"name":"x","resourceVersion":"7"}}`, code: 409,
			respBody: `{"kind":"Status","reason":"Conflict","message":"the object has been modified"}`,
			want: Request{Verb: "update", APIVersion: "v1", Resource: "configmaps", Namespace: "ns", Name: "x", Code: 409,
				Reason: "Conflict", Message: "the object has been modified", Stamp: "7"},
		},
		{
			name: "a create takes its name from the body, a lease its holder", method: "POST",
			url:  "/apis/coordination.k8s.io/v1/namespaces/ns/leases?dryRun=All",
			body: `{"metadata":{"name":"l"},"spec":{"holderIdentity":"a"}}`, code: 201,
			want: Request{Verb: "create", APIGroup: "coordination.k8s.io", APIVersion: "v1", Resource: "leases", Namespace: "ns", Name: "l", Code: 201, DryRun: true, Holder: ptr("a")},
		},
		{
			name: "an apply conflict records its causes and field manager", method: "PATCH",
			url:      "/api/v1/namespaces/ns/configmaps/x/status?fieldManager=bob-tool",
			body:     `{}`,
			code:     409,
			respBody: `{"kind":"Status","reason":"Conflict","message":"Apply failed","details":{"causes":[{"reason":"FieldManagerConflict"}]}}`,
			want: Request{Verb: "patch", APIVersion: "v1", Resource: "configmaps", Subresource: "status", Namespace: "ns", Name: "x", Code: 409,
				Reason: "Conflict", Message: "Apply failed", Causes: []string{"FieldManagerConflict"}, FieldManager: "bob-tool"},
		},
		{
			name: "a list without a name is a list, a delete without one a deletecollection", method: "DELETE",
			url: "/api/v1/namespaces/ns/configmaps", code: 200,
			want: Request{Verb: "deletecollection", APIVersion: "v1", Resource: "configmaps", Namespace: "ns", Code: 200},
		},
		{
			name: "a namespace is in itself", method: "GET", url: "/api/v1/namespaces/ns", code: 200,
			want: Request{Verb: "get", APIVersion: "v1", Resource: "namespaces", Namespace: "ns", Name: "ns", Code: 200},
		},
		{
			name: "a namespace's status is its subresource", method: "PUT", url: "/api/v1/namespaces/ns/status", body: `{"metadata":{"resourceVersion":"3"}}`, code: 200,
			want: Request{Verb: "update", APIVersion: "v1", Resource: "namespaces", Subresource: "status", Namespace: "ns", Name: "ns", Code: 200, Stamp: "3"},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			rec := &recorder{now: func() time.Time { return t0 }}
			srv := &apiserver{code: c.code, body: c.respBody}
			var body io.Reader
			if c.body != "" {
				body = strings.NewReader(c.body)
			}
			req, err := http.NewRequestWithContext(t.Context(), c.method, "https://apiserver"+c.url, body)
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Impersonate-User", "alice")
			resp, err := rec.wrap(srv).RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if b, _ := io.ReadAll(resp.Body); string(b) != c.respBody {
				t.Errorf("the client got body %q, want the server's %q", b, c.respBody)
			}
			if srv.got != c.body {
				t.Errorf("the server got body %q, want %q", srv.got, c.body)
			}
			got := rec.requests()
			want := c.want
			want.Writer, want.AuditID, want.Start, want.End = "alice", "id-1", t0, t0
			if len(got) != 1 || !reflect.DeepEqual(got[0], want) {
				t.Errorf("recorded\n got %+v\nwant %+v", got, want)
			}
		})
	}
}

func ptr(s string) *string { return &s }
