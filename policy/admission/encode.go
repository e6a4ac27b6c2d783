package admission

import (
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/stampguard/stampguard/internal/rawjson"
)

// appendReview appends the AdmissionReview that carries out, as
// encoding/json would write reviewOut (the same members, order and
// omissions, map keys sorted) without its
// reflection: the answer is written on every call, refusals included,
// which a refused writer's retries make the busy path. A test decodes it
// with the k8s.io types and compares it with encoding/json's.
func appendReview(b []byte, out *responseOut) []byte {
	b = append(b, `{"apiVersion":"`+reviewAPIVersion+`","kind":"AdmissionReview","response":{"uid":`...)
	b = appendJSONString(b, out.UID)
	b = append(b, `,"allowed":`...)
	b = strconv.AppendBool(b, out.Allowed)
	if s := out.Status; s != nil {
		b = append(b, `,"status":{"status":`...)
		b = appendJSONString(b, s.Status)
		b = append(b, `,"message":`...)
		b = appendJSONString(b, s.Message)
		b = append(b, `,"reason":`...)
		b = appendJSONString(b, string(s.Reason))
		b = append(b, `,"code":`...)
		b = strconv.AppendInt(b, int64(s.Code), 10)
		if d := s.Details; d != nil {
			b = appendDetails(append(b, `,"details":`...), d)
		}
		b = append(b, '}')
	}
	if len(out.Warnings) > 0 {
		b = append(b, `,"warnings":[`...)
		for i, w := range out.Warnings {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendJSONString(b, w)
		}
		b = append(b, ']')
	}
	if len(out.AuditAnnotations) > 0 {
		keys := make([]string, 0, len(out.AuditAnnotations))
		for k := range out.AuditAnnotations {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		b = append(b, `,"auditAnnotations":{`...)
		for i, k := range keys {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(appendJSONString(b, k), ':')
			b = appendJSONString(b, out.AuditAnnotations[k])
		}
		b = append(b, '}')
	}
	return append(b, "}}\n"...)
}

func appendDetails(b []byte, d *detailsOut) []byte {
	b = append(b, '{')
	first := true
	member := func(name, v string) {
		if v == "" {
			return
		}
		if !first {
			b = append(b, ',')
		}
		first = false
		b = append(b, name...)
		b = appendJSONString(b, v)
	}
	member(`"name":`, d.Name)
	member(`"group":`, d.Group)
	member(`"kind":`, d.Kind)
	if len(d.Causes) > 0 {
		if !first {
			b = append(b, ',')
		}
		b = append(b, `"causes":[`...)
		for i, c := range d.Causes {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"reason":`...)
			b = appendJSONString(b, string(c.Type))
			b = append(b, `,"message":`...)
			b = appendJSONString(b, c.Message)
			b = append(b, `,"field":`...)
			b = appendJSONString(b, c.Field)
			b = append(b, '}')
		}
		b = append(b, ']')
	}
	return append(b, '}')
}

// appendJSONString is rawjson.AppendString for any string: invalid UTF-8
// (a message may quote a value) becomes U+FFFD, so the answer stays JSON.
func appendJSONString(b []byte, s string) []byte {
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	return rawjson.AppendString(b, s)
}
