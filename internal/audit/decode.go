package audit

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/stampguard/stampguard/internal/rawjson"
	"github.com/stampguard/stampguard/policy/api/annotation"
)

// Decoder flattens raw audit.k8s.io/v1 Event JSON into Rows. The zero value
// redacts secrets and keeps no raw event.
type Decoder struct {
	// RedactResources names resources (besides secrets, always redacted)
	// whose requestObject and responseObject are removed from the raw event.
	RedactResources []string
	// KeepRaw keeps the redacted raw event in Row.Raw.
	KeepRaw bool
	// AnnotationMatch selects the audit annotations kept in the row: keys
	// containing this string. Defaults to annotation.Kept ("stampguard").
	AnnotationMatch string
	// History, when set, fills the field history of the writes that have
	// one (historyWrite): Row.ObjectVersion, Fields, FullView and
	// RequestManaged, with values hashed by History.
	History *FieldHasher
}

// Errors for events that cannot become a row; they go to the dead-letter
// table with the raw bytes.
var (
	ErrMissingAuditID   = errors.New("event has no auditID")
	ErrMissingStage     = errors.New("event has no stage")
	ErrMissingTimestamp = errors.New("event has no stageTimestamp")
)

// span is a byte range of the raw event.
type span struct{ from, to int }

// Decode flattens one raw event into r, overwriting it. On error r is
// unspecified.
func (d *Decoder) Decode(raw string, r *Row) error {
	_, err := d.decode(raw, r, false)
	return err
}

// decode is Decode; with prefix the event is the JSON object at the start
// of raw, which may go on after it (ListReader.NextRow decodes events in
// its read buffer), and decode returns the object's length.
func (d *Decoder) decode(raw string, r *Row, prefix bool) (int, error) {
	*r = Row{UserGroups: r.UserGroups[:0], ImpersonatedGroups: r.ImpersonatedGroups[:0], CauseReasons: r.CauseReasons[:0],
		CauseFields: r.CauseFields[:0], AnnotationKeys: r.AnnotationKeys[:0],
		AnnotationValues: r.AnnotationValues[:0], Fields: Fields{Paths: r.Fields.Paths[:0], Hashes: r.Fields.Hashes[:0]}}
	p := rawjson.NewScanner(raw)
	var (
		objBuf       [2]span
		objects      = objBuf[:0] // requestObject, responseObject values, for redaction
		holder       string
		received     string
		stage        string
		annotMatch   = d.AnnotationMatch
		ignoreHolder bool
	)
	if annotMatch == "" {
		annotMatch = annotation.Kept
	}
	if p.Peek() != '{' {
		return 0, fmt.Errorf("event is not a JSON object")
	}
	err := p.Members(func(key string) error {
		var err error
		switch key {
		case "auditID":
			r.AuditID, err = p.OptStr()
		case "stage":
			r.Stage, err = p.OptStr()
		case "level":
			r.Level, err = p.OptStr()
		case "verb":
			r.Verb, err = p.OptStr()
		case "requestURI":
			r.RequestURI, err = p.OptStr()
		case "userAgent":
			r.UserAgent, err = p.OptStr()
		case "sourceIPs":
			r.SourceIP, err = p.FirstStr()
		case "user":
			r.UserGroups = r.UserGroups[:0]
			err = d.user(&p, &r.User, &r.UserGroups)
		case "impersonatedUser":
			r.ImpersonatedGroups = r.ImpersonatedGroups[:0]
			err = d.user(&p, &r.ImpersonatedUser, &r.ImpersonatedGroups)
		case "objectRef":
			err = d.objectRef(&p, r)
		case "responseStatus":
			err = d.status(&p, r)
		case "requestObject", "responseObject":
			from := p.Pos()
			if key == "requestObject" {
				holder, err = leaseHolder(&p)
				ignoreHolder = err != nil
			} else {
				err = p.SkipFast()
			}
			if err == nil {
				objects = append(objects, span{from, p.Pos()})
				if obj := strings.TrimLeft(raw[from:p.Pos()], " \t\r\n"); obj != "null" {
					if key == "requestObject" {
						r.RequestObject = obj
					} else {
						r.ResponseObject = obj
					}
				}
			}
		case "requestReceivedTimestamp":
			received, err = p.OptStr()
		case "stageTimestamp":
			stage, err = p.OptStr()
		case "annotations":
			r.AnnotationKeys, r.AnnotationValues = r.AnnotationKeys[:0], r.AnnotationValues[:0]
			err = p.Members(func(k string) error {
				v, err := p.OptStr()
				switch {
				case err != nil:
				case k == "authorization.k8s.io/decision":
					r.AuthzDecision = v
				case strings.Contains(k, annotMatch):
					r.AnnotationKeys = append(r.AnnotationKeys, k)
					r.AnnotationValues = append(r.AnnotationValues, v)
				}
				return err
			})
		default:
			err = p.SkipFast()
		}
		if err != nil {
			return fmt.Errorf("%s: %w", key, err)
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	if prefix {
		raw = raw[:p.Pos()]
	} else if p.Peek() != 0 {
		return 0, p.Errorf("data after the event object")
	}
	if r.AuditID == "" {
		return 0, ErrMissingAuditID
	}
	if r.Stage == "" {
		return 0, ErrMissingStage
	}
	if stage == "" {
		return 0, ErrMissingTimestamp
	}
	if r.StageMicros, err = parseMicros(stage); err != nil {
		return 0, fmt.Errorf("stageTimestamp: %w", err)
	}
	if received != "" {
		if r.RequestReceivedMicros, err = parseMicros(received); err != nil {
			return 0, fmt.Errorf("requestReceivedTimestamp: %w", err)
		}
	}
	if r.Resource == "leases" && !ignoreHolder {
		r.LeaseHolder = holder
	}
	r.FieldManager, r.DryRun, r.Force, r.Apply = uriOptions(r.RequestURI)
	r.Fingerprint = Fingerprint(r)
	if d.History != nil && d.historyWrite(r) {
		d.history(r)
	}
	if d.KeepRaw {
		if len(objects) > 0 && d.redacts(r.Resource) {
			r.Raw = redact(raw, objects)
		} else {
			r.Raw = raw
		}
	}
	return len(raw), nil
}

// Redacts reports whether the objects of resource are removed.
func (d *Decoder) redacts(resource string) bool {
	if resource == "secrets" {
		return true
	}
	for _, r := range d.RedactResources {
		if r == resource {
			return true
		}
	}
	return false
}

// redact replaces the object values at spans with null: the member stays,
// its content is gone, and the JSON stays valid without comma surgery.
func redact(raw string, spans []span) string {
	var b strings.Builder
	b.Grow(len(raw))
	last := 0
	for _, s := range spans {
		b.WriteString(raw[last:s.from])
		b.WriteString("null")
		last = s.to
	}
	b.WriteString(raw[last:])
	return b.String()
}

func (d *Decoder) user(p *rawjson.Scanner, name *string, groups *[]string) error {
	if p.Peek() == 'n' && p.Null() {
		return nil
	}
	return p.Members(func(k string) error {
		var err error
		switch k {
		case "username":
			*name, err = p.OptStr()
		case "groups":
			*groups, err = p.StrList((*groups)[:0])
		default:
			err = p.SkipFast()
		}
		return err
	})
}

func (d *Decoder) objectRef(p *rawjson.Scanner, r *Row) error {
	if p.Peek() == 'n' && p.Null() {
		return nil
	}
	return p.Members(func(k string) error {
		var err error
		switch k {
		case "resource":
			r.Resource, err = p.OptStr()
		case "namespace":
			r.Namespace, err = p.OptStr()
		case "name":
			r.Name, err = p.OptStr()
		case "uid":
			r.ObjectUID, err = p.OptStr()
		case "apiGroup":
			r.APIGroup, err = p.OptStr()
		case "apiVersion":
			r.APIVersion, err = p.OptStr()
		case "resourceVersion":
			r.Stamp, err = p.OptStr()
		case "subresource":
			r.Subresource, err = p.OptStr()
		default:
			err = p.SkipFast()
		}
		return err
	})
}

func (d *Decoder) status(p *rawjson.Scanner, r *Row) error {
	if p.Peek() == 'n' && p.Null() {
		return nil
	}
	return p.Members(func(k string) error {
		var err error
		switch k {
		case "code":
			r.Code, err = p.Int32()
		case "reason":
			r.Reason, err = p.OptStr()
		case "message":
			r.Message, err = p.OptStr()
		case "details":
			if p.Peek() == 'n' && p.Null() {
				return nil
			}
			err = p.Members(func(k string) error {
				if k != "causes" {
					return p.SkipFast()
				}
				r.CauseReasons, r.CauseFields = r.CauseReasons[:0], r.CauseFields[:0]
				if p.Peek() == 'n' && p.Null() {
					return nil
				}
				return p.Elements(func() error {
					var reason, field string
					if p.Peek() == 'n' && p.Null() {
						return nil
					}
					err := p.Members(func(k string) error {
						var err error
						switch k {
						case "reason":
							reason, err = p.OptStr()
						case "field":
							field, err = p.OptStr()
						default:
							err = p.SkipFast()
						}
						return err
					})
					r.CauseReasons = append(r.CauseReasons, reason)
					r.CauseFields = append(r.CauseFields, field)
					return err
				})
			})
		default:
			err = p.SkipFast()
		}
		return err
	})
}

// leaseHolder skips requestObject and returns its spec.holderIdentity.
func leaseHolder(p *rawjson.Scanner) (string, error) {
	var holder string
	if p.Peek() != '{' {
		return "", p.SkipFast()
	}
	err := p.Members(func(k string) error {
		if k != "spec" || p.Peek() != '{' {
			return p.SkipFast()
		}
		return p.Members(func(k string) error {
			if k != "holderIdentity" {
				return p.SkipFast()
			}
			if p.Peek() != '"' {
				return p.SkipFast()
			}
			var err error
			holder, err = p.Str()
			return err
		})
	})
	return holder, err
}

// parseMicros parses an RFC 3339 timestamp as the apiserver writes it
// ("2026-11-29T08:50:48.123456Z") into Unix microseconds, with a fast path
// for UTC and a fallback for any RFC 3339 form.
func parseMicros(s string) (int64, error) {
	if us, ok := fastMicros(s); ok {
		return us, nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return 0, err
	}
	return t.UnixMicro(), nil
}

func fastMicros(s string) (int64, bool) {
	// 2006-01-02T15:04:05Z or 2006-01-02T15:04:05.999999Z
	if len(s) < 20 || s[len(s)-1] != 'Z' || s[4] != '-' || s[7] != '-' || s[10] != 'T' ||
		s[13] != ':' || s[16] != ':' {
		return 0, false
	}
	num := func(from, to int) (int, bool) {
		n := 0
		for i := from; i < to; i++ {
			c := s[i]
			if c < '0' || c > '9' {
				return 0, false
			}
			n = n*10 + int(c-'0')
		}
		return n, true
	}
	year, ok1 := num(0, 4)
	month, ok2 := num(5, 7)
	day, ok3 := num(8, 10)
	hour, ok4 := num(11, 13)
	minute, ok5 := num(14, 16)
	sec, ok6 := num(17, 19)
	if !ok1 || !ok2 || !ok3 || !ok4 || !ok5 || !ok6 || month < 1 || month > 12 || day < 1 ||
		day > 31 || hour > 23 || minute > 59 || sec > 59 {
		return 0, false
	}
	micros := 0
	switch rest := s[19 : len(s)-1]; {
	case rest == "":
	case rest[0] == '.' && len(rest) >= 2 && len(rest) <= 10:
		frac, ok := num(20, len(s)-1)
		if !ok {
			return 0, false
		}
		digits := len(rest) - 1
		for ; digits < 6; digits++ {
			frac *= 10
		}
		for ; digits > 6; digits-- {
			frac /= 10
		}
		micros = frac
	default:
		return 0, false
	}
	t := time.Date(year, time.Month(month), day, hour, minute, sec, 0, time.UTC)
	if t.Day() != day { // 31 Feb and friends: let time.Parse reject it
		return 0, false
	}
	return t.Unix()*1e6 + int64(micros), true
}

// uriOptions reads fieldManager, dryRun and force from a request URI's
// query, as the apiserver reads them into its options; apply is the
// presence of force, which client-go and kubectl send with every
// server-side apply and with nothing else.
func uriOptions(uri string) (fieldManager string, dryRun, force, apply bool) {
	seenManager, seenForce := false, false
	q := strings.IndexByte(uri, '?')
	if q < 0 {
		return "", false, false, false
	}
	query := uri[q+1:]
	for query != "" {
		var kv string
		kv, query, _ = strings.Cut(query, "&")
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case "fieldManager":
			if seenManager {
				break // the apiserver takes the first value
			}
			seenManager = true
			if u, err := url.QueryUnescape(v); err == nil {
				fieldManager = u
			} else {
				fieldManager = v
			}
		case "dryRun":
			// The apiserver's dryrun.IsDryRun: any dryRun parameter. A value
			// other than All is refused (400) before anything is stored.
			dryRun = true
		case "force":
			if !seenForce { // the first value, as the apiserver converts it:
				seenForce = true // anything but 0 and false is true
				force = v != "0" && !strings.EqualFold(v, "false")
			}
		}
	}
	return fieldManager, dryRun, force, seenForce
}
