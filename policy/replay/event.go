package replay

import (
	"errors"
	"fmt"
	"strings"
	"time"
	"unsafe"

	"github.com/stampguard/stampguard/internal/audit"
	"github.com/stampguard/stampguard/policy"
	"github.com/stampguard/stampguard/policy/api/annotation"
)

// event is what replay reads of one audit.k8s.io/v1 Event: the row the
// audit sink's decoder makes of it (one reading of an event for both
// halves), and what replay derives from the row.
type event struct {
	audit.Row
	// user is the writer admission saw: the impersonated user, when there
	// is one.
	user policy.UserInfo
	// reqObj and respObj are the request and response bodies, nil when the
	// event holds none.
	reqObj, respObj []byte
	time            time.Time
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

// decoder is the audit sink's decoder as replay uses it: no raw event
// kept, every annotation naming stampguard (annotation.Kept) in the row.
var decoder audit.Decoder

// parseEvent reads one line of an audit log into ev.
func parseEvent(line []byte, ev *event) error {
	live := ev.live[:0]
	row := ev.Row
	// The row's strings point into this copy of the line, which nothing
	// writes to: they stay valid after the reader reuses its buffer.
	if err := decoder.Decode(string(line), &row); err != nil {
		*ev = event{Row: row, live: live}
		return fmt.Errorf("%w: %w", errNotEvent, err)
	}
	*ev = event{Row: row, live: live, time: time.UnixMicro(row.StageMicros).UTC()}
	ev.user = policy.UserInfo{Name: row.Writer(), Groups: row.WriterGroups()}
	ev.reqObj, ev.respObj = readOnly(row.RequestObject), readOnly(row.ResponseObject)
	ev.authzForbid = row.AuthzDecision == "forbid"
	ev.fieldsRefused = strings.HasPrefix(row.Message, fieldsRefusal)
	for i, key := range row.AnnotationKeys {
		if !strings.Contains(key, annotation.Match) {
			continue
		}
		entries, err := annotation.Parse(row.AnnotationValues[i])
		if err != nil {
			return fmt.Errorf("%w: annotation %s: %w", errNotEvent, key, err)
		}
		ev.live = append(ev.live, entries...)
	}
	return nil
}

// fieldsRefusal begins the message of a refusal by stampguard's fields
// webhook, as the apiserver words it.
const fieldsRefusal = `admission webhook "` + annotation.FieldsWebhook + `" denied the request`

// readOnly is the bytes of s without a copy, nil for "". Replay only reads
// the bodies (rawjson never writes, objectState.add clones what it keeps),
// and s is immutable, so the slice must never be written to.
func readOnly(s string) []byte {
	if s == "" {
		return nil
	}
	return unsafe.Slice(unsafe.StringData(s), len(s))
}
