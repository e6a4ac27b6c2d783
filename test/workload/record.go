package workload

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"
)

// Request is what the client saw of one request: the ground truth for one
// audit event. It is filled from the request the client sent and the
// response it got, never from the audit log.
type Request struct {
	// AuditID is the Audit-Id response header.
	AuditID string `json:"audit_id"`
	// Start is the client's clock just before the request was sent (UTC);
	// End just after the response headers arrived.
	Start time.Time `json:"start"`
	End   time.Time `json:"end"`
	// Writer is the impersonated username (the Impersonate-User header).
	Writer string `json:"writer"`
	// Verb is the apiserver's verb for the request: get, list, watch,
	// create, update, patch, delete or deletecollection.
	Verb        string `json:"verb"`
	APIGroup    string `json:"api_group"`
	APIVersion  string `json:"api_version"`
	Resource    string `json:"resource"`
	Subresource string `json:"subresource,omitempty"`
	Namespace   string `json:"namespace,omitempty"`
	// Name comes from the URL, or from the body's metadata.name for a create.
	Name string `json:"name,omitempty"`
	// Code is the HTTP status code; Reason, Message and Causes come from the
	// Status body of an error response.
	Code    int      `json:"code"`
	Reason  string   `json:"reason,omitempty"`
	Message string   `json:"message,omitempty"`
	Causes  []string `json:"causes,omitempty"`
	// DryRun is set when the request carried the dryRun query parameter.
	DryRun bool `json:"dry_run,omitempty"`
	// Stamp is the metadata.resourceVersion that a create or update body
	// carried ("" when it carried none).
	Stamp string `json:"stamp,omitempty"`
	// Holder is spec.holderIdentity of a lease create or update body, nil
	// when the body has no holder (or is not a lease write).
	Holder *string `json:"holder,omitempty"`
	// FieldManager is the fieldManager query parameter.
	FieldManager string `json:"field_manager,omitempty"`
}

// Succeeded reports a 2xx response.
func (r Request) Succeeded() bool { return r.Code >= 200 && r.Code < 300 }

// recorder is an http.RoundTripper that records every request it carries.
// It sits innermost in client-go's transport chain (rest.Config.WrapTransport),
// so it sees the Impersonate-User header that client-go adds.
type recorder struct {
	mu   sync.Mutex
	reqs []Request
	now  func() time.Time
}

// transport records into log what it carries to next.
type transport struct {
	log  *recorder
	next http.RoundTripper
}

// maxBody bounds what the recorder reads of a request or error body.
const maxBody = 1 << 20

// wrap is a rest.Config.WrapTransport.
func (rec *recorder) wrap(next http.RoundTripper) http.RoundTripper {
	return &transport{log: rec, next: next}
}

func (tr *transport) RoundTrip(req *http.Request) (*http.Response, error) {
	rec := tr.log
	r := Request{Writer: req.Header.Get("Impersonate-User")}
	if err := parseURL(req, &r); err != nil {
		return nil, err
	}
	if req.Body != nil && (req.Method == http.MethodPost || req.Method == http.MethodPut) {
		b, err := io.ReadAll(io.LimitReader(req.Body, maxBody))
		_ = req.Body.Close()
		if err != nil {
			return nil, fmt.Errorf("record request body: %w", err)
		}
		req.Body = io.NopCloser(bytes.NewReader(b))
		req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }
		parseBody(b, &r)
	}
	r.Start = rec.now().UTC()
	resp, err := tr.next.RoundTrip(req)
	r.End = rec.now().UTC()
	if err != nil {
		return nil, err
	}
	r.Code = resp.StatusCode
	r.AuditID = resp.Header.Get("Audit-Id")
	if resp.StatusCode >= 400 && resp.Body != nil {
		b, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
		_ = resp.Body.Close()
		if err != nil {
			return nil, fmt.Errorf("record response body: %w", err)
		}
		resp.Body = io.NopCloser(bytes.NewReader(b))
		parseStatus(b, &r)
	}
	rec.mu.Lock()
	rec.reqs = append(rec.reqs, r)
	rec.mu.Unlock()
	return resp, nil
}

func (rec *recorder) requests() []Request {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return append([]Request(nil), rec.reqs...)
}

// parseURL fills the verb and the object from the request line, the way the
// apiserver's RequestInfoFactory reads it for resource requests.
func parseURL(req *http.Request, r *Request) error {
	parts := strings.Split(strings.Trim(req.URL.Path, "/"), "/")
	switch {
	case len(parts) >= 2 && parts[0] == "api":
		r.APIVersion, parts = parts[1], parts[2:]
	case len(parts) >= 3 && parts[0] == "apis":
		r.APIGroup, r.APIVersion, parts = parts[1], parts[2], parts[3:]
	default:
		return fmt.Errorf("workload: not a resource request: %s", req.URL.Path)
	}
	// As the apiserver reads it: /namespaces/{ns}/{resource}/..., except the
	// namespace's own subresources; a namespace is its own namespace.
	if len(parts) >= 2 && parts[0] == "namespaces" {
		r.Namespace = parts[1]
		if len(parts) >= 3 && parts[2] != "status" && parts[2] != "finalize" {
			parts = parts[2:]
		}
	}
	if len(parts) == 0 {
		return fmt.Errorf("workload: no resource in %s", req.URL.Path)
	}
	r.Resource = parts[0]
	if len(parts) > 1 {
		r.Name = parts[1]
	}
	if len(parts) > 2 {
		r.Subresource = parts[2]
	}
	q := req.URL.Query()
	r.DryRun = len(q["dryRun"]) > 0
	r.FieldManager = q.Get("fieldManager")
	switch req.Method {
	case http.MethodGet:
		switch {
		case r.Name != "":
			r.Verb = "get"
		case q.Get("watch") == "true" || q.Get("watch") == "1":
			r.Verb = "watch"
		default:
			r.Verb = "list"
		}
	case http.MethodPost:
		r.Verb = "create"
	case http.MethodPut:
		r.Verb = "update"
	case http.MethodPatch:
		r.Verb = "patch"
	case http.MethodDelete:
		r.Verb = "delete"
		if r.Name == "" {
			r.Verb = "deletecollection"
		}
	default:
		return fmt.Errorf("workload: unexpected method %s", req.Method)
	}
	return nil
}

func parseBody(b []byte, r *Request) {
	var obj struct {
		Metadata struct {
			Name            string `json:"name"`
			ResourceVersion string `json:"resourceVersion"`
		} `json:"metadata"`
		Spec struct {
			HolderIdentity *string `json:"holderIdentity"`
		} `json:"spec"`
	}
	if json.Unmarshal(b, &obj) != nil {
		return
	}
	if r.Verb == "create" && r.Name == "" {
		r.Name = obj.Metadata.Name
	}
	r.Stamp = obj.Metadata.ResourceVersion
	if r.Resource == "leases" {
		r.Holder = obj.Spec.HolderIdentity
	}
}

func parseStatus(b []byte, r *Request) {
	var st struct {
		Kind    string `json:"kind"`
		Reason  string `json:"reason"`
		Message string `json:"message"`
		Details *struct {
			Causes []struct {
				Reason string `json:"reason"`
			} `json:"causes"`
		} `json:"details"`
	}
	if json.Unmarshal(b, &st) != nil || st.Kind != "Status" {
		return
	}
	r.Reason, r.Message = st.Reason, st.Message
	if st.Details != nil {
		for _, c := range st.Details.Causes {
			r.Causes = append(r.Causes, c.Reason)
		}
	}
}
