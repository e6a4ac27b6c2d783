package replay

import (
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/stampguard/stampguard/policy"
	"github.com/stampguard/stampguard/policy/api/annotation"
	"github.com/stampguard/stampguard/policy/internal/rawjson"
)

// event is what replay reads of one audit.k8s.io/v1 Event. The objects
// stay raw JSON, slices of the line.
type event struct {
	level, auditID, stage, verb, uri string
	user                             policy.UserInfo
	group, resource, sub, ns, name   string
	refRV                            string // objectRef.resourceVersion
	code                             int
	reqObj, respObj                  []byte
	time                             time.Time
	// live are the decisions the webhook wrote as audit annotations.
	live []annotation.Entry
	// authzForbid is set when the authorizer refused the request: admission
	// never saw it.
	authzForbid bool
	// fieldsRefused is set when stampguard's fields webhook refused the
	// request (its 422 names the webhook).
	fieldsRefused bool
}

// errNotEvent is wrapped for a line that is no audit event.
var errNotEvent = errors.New("not an audit event")

// parseEvent reads one line of an audit log. Objects of the result share
// the line's bytes.
func parseEvent(line []byte, ev *event) error {
	*ev = event{live: ev.live[:0]}
	if rawjson.Kind(line) != '{' {
		return fmt.Errorf("%w: the line is not a JSON object", errNotEvent)
	}
	var stageTS, receivedTS string
	var authn, imp policy.UserInfo
	var impersonated bool
	var err error
	str := func(v []byte, dst *string) bool {
		*dst, err = rawjson.String(v)
		return err == nil
	}
	walkErr := rawjson.ObjectEach(line, func(k, v []byte) bool {
		switch {
		case rawjson.KeyIs(k, "level"):
			return str(v, &ev.level)
		case rawjson.KeyIs(k, "auditID"):
			return str(v, &ev.auditID)
		case rawjson.KeyIs(k, "stage"):
			return str(v, &ev.stage)
		case rawjson.KeyIs(k, "verb"):
			return str(v, &ev.verb)
		case rawjson.KeyIs(k, "requestURI"):
			return str(v, &ev.uri)
		case rawjson.KeyIs(k, "stageTimestamp"):
			return str(v, &stageTS)
		case rawjson.KeyIs(k, "requestReceivedTimestamp"):
			return str(v, &receivedTS)
		case rawjson.KeyIs(k, "user"):
			if rawjson.Kind(v) == '{' {
				authn, err = policy.DecodeUserInfo(v)
			}
		case rawjson.KeyIs(k, "impersonatedUser"):
			if rawjson.Kind(v) == '{' {
				imp, err = policy.DecodeUserInfo(v)
				impersonated = true
			}
		case rawjson.KeyIs(k, "objectRef"):
			err = parseObjectRef(v, ev)
		case rawjson.KeyIs(k, "responseStatus"):
			if rawjson.Kind(v) == '{' {
				var c []byte
				var ok bool
				if c, ok, err = rawjson.Member(v, "code"); err == nil && ok {
					ev.code, err = strconv.Atoi(string(rawjson.Trim(c)))
				}
				if m, ok, merr := rawjson.Member(v, "message"); err == nil && merr == nil && ok && rawjson.Kind(m) == '"' {
					var msg string
					if msg, err = rawjson.String(m); err == nil {
						ev.fieldsRefused = strings.HasPrefix(msg, fieldsRefusal)
					}
				} else if err == nil {
					err = merr
				}
			}
		case rawjson.KeyIs(k, "requestObject"):
			if !rawjson.IsNull(v) {
				ev.reqObj = rawjson.Trim(v)
			}
		case rawjson.KeyIs(k, "responseObject"):
			if !rawjson.IsNull(v) {
				ev.respObj = rawjson.Trim(v)
			}
		case rawjson.KeyIs(k, "annotations"):
			err = parseAnnotations(v, ev)
		}
		return err == nil
	})
	if walkErr != nil {
		return fmt.Errorf("%w: %w", errNotEvent, walkErr)
	}
	if err != nil {
		return fmt.Errorf("%w: %w", errNotEvent, err)
	}
	// Admission sees the impersonated user, when there is one.
	ev.user = authn
	if impersonated {
		ev.user = imp
	}
	ts := stageTS
	if ts == "" {
		ts = receivedTS
	}
	if ev.auditID == "" || ev.stage == "" || ts == "" {
		return fmt.Errorf("%w: it lacks auditID, stage or stageTimestamp", errNotEvent)
	}
	if ev.time, err = time.Parse(time.RFC3339Nano, ts); err != nil {
		return fmt.Errorf("%w: stageTimestamp: %w", errNotEvent, err)
	}
	return nil
}

func parseObjectRef(v []byte, ev *event) error {
	if rawjson.Kind(v) != '{' {
		return nil
	}
	var err error
	walkErr := rawjson.ObjectEach(v, func(k, v []byte) bool {
		switch {
		case rawjson.KeyIs(k, "resource"):
			ev.resource, err = rawjson.String(v)
		case rawjson.KeyIs(k, "namespace"):
			ev.ns, err = rawjson.String(v)
		case rawjson.KeyIs(k, "name"):
			ev.name, err = rawjson.String(v)
		case rawjson.KeyIs(k, "apiGroup"):
			ev.group, err = rawjson.String(v)
		case rawjson.KeyIs(k, "subresource"):
			ev.sub, err = rawjson.String(v)
		case rawjson.KeyIs(k, "resourceVersion"):
			ev.refRV, err = rawjson.String(v)
		}
		return err == nil
	})
	return errors.Join(walkErr, err)
}

// parseAnnotations keeps stampguard's decisions and the authorizer's.
func parseAnnotations(v []byte, ev *event) error {
	if rawjson.Kind(v) != '{' {
		return nil
	}
	var err error
	walkErr := rawjson.ObjectEach(v, func(k, v []byte) bool {
		key, kerr := rawjson.Unquote(k)
		if kerr != nil {
			err = kerr
			return false
		}
		switch {
		case key == "authorization.k8s.io/decision":
			var d string
			d, err = rawjson.String(v)
			ev.authzForbid = d == "forbid"
		case strings.Contains(key, annotation.Match):
			var s string
			if s, err = rawjson.String(v); err != nil {
				return false
			}
			entries, perr := annotation.Parse(s)
			if perr != nil {
				err = fmt.Errorf("annotation %s: %w", key, perr)
				return false
			}
			ev.live = append(ev.live, entries...)
		}
		return err == nil
	})
	return errors.Join(walkErr, err)
}

// query reads the request's options from its URI: the fieldManager and
// dryRun of create, update and patch are query parameters.
func (ev *event) query() (fieldManager string, dryRun bool) {
	_, q, ok := strings.Cut(ev.uri, "?")
	if !ok {
		return "", false
	}
	vals, err := url.ParseQuery(q)
	if err != nil {
		return "", false
	}
	return vals.Get("fieldManager"), len(vals["dryRun"]) > 0
}

// isSuccess is a 2xx answer: the write was applied (or dry-run).
func (ev *event) isSuccess() bool { return ev.code >= 200 && ev.code < 300 }

// hasBody reports whether the event's level records request bodies.
func (ev *event) hasBody() bool { return ev.level == "Request" || ev.level == "RequestResponse" }

// hasResponse reports whether the event's level records response bodies.
func (ev *event) hasResponse() bool { return ev.level == "RequestResponse" }

// fieldsRefusal begins the message of a refusal by stampguard's fields
// webhook, as the apiserver words it.
const fieldsRefusal = `admission webhook "` + annotation.FieldsWebhook + `" denied the request`
