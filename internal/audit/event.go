// Package audit reads kube-apiserver audit events (audit.k8s.io/v1): it
// splits an EventList body into raw events (ListReader, stream.go),
// flattens each into a Row with its Fingerprint (Decoder, decode.go, over
// the scanner of json.go), and names what could not become a row
// (DeadLetter). NextRow does both: ListReader.NextRow decodes an event
// where it lies in the read buffer, in the pass that finds its end. It knows nothing of storage: package analytics/record
// encodes Rows into spool records, and analytics/store stores them in
// ClickHouse.
package audit

// Audit event stages (audit.k8s.io/v1 Stage).
const (
	StageRequestReceived  = "RequestReceived"
	StageResponseStarted  = "ResponseStarted"
	StageResponseComplete = "ResponseComplete"
	StagePanic            = "Panic"
)

// Audit levels (audit.k8s.io/v1 Level): what an event holds of the request.
const (
	LevelMetadata        = "Metadata"
	LevelRequest         = "Request"
	LevelRequestResponse = "RequestResponse"
)

// DefaultStages are the stages stored unless configured otherwise: each
// request counts once, on ResponseComplete or Panic.
var DefaultStages = []string{StageResponseComplete, StagePanic}

// Row is one audit event flattened to the columns of the `events` table.
// Strings may share memory with the raw event they were decoded from.
type Row struct {
	Cluster    string
	AuditID    string
	Stage      string
	Level      string
	Verb       string
	RequestURI string
	DryRun     bool

	User               string
	UserGroups         []string
	ImpersonatedUser   string
	ImpersonatedGroups []string
	UserAgent          string
	SourceIP           string

	APIGroup    string
	APIVersion  string
	Resource    string
	Subresource string
	Namespace   string
	Name        string
	ObjectUID   string
	// Stamp is objectRef.resourceVersion: the resourceVersion the request
	// carried (empty for a stampless update).
	Stamp        string
	FieldManager string

	Code         int32
	Reason       string
	Message      string
	CauseReasons []string
	CauseFields  []string

	// RequestReceivedMicros and StageMicros are Unix epoch microseconds.
	RequestReceivedMicros int64
	StageMicros           int64

	AuthzDecision    string
	AnnotationKeys   []string
	AnnotationValues []string
	LeaseHolder      string

	// RequestObject and ResponseObject are the raw JSON of the event's
	// requestObject and responseObject, slices of the event ("" when absent
	// or null). Only the levels Request and RequestResponse log them; no
	// column stores them (Raw does, redacted).
	RequestObject  string
	ResponseObject string

	// Force is a server-side apply's force=true, read from RequestURI;
	// Apply says the URI has a force parameter, as every server-side apply
	// from client-go or kubectl has.
	Force, Apply bool

	// The field history of a successful write logged with its response
	// (Decoder.History, fields.go): ObjectVersion is the stored object's
	// resourceVersion as an integer (0: none or not decimal), Fields the
	// fields it shows, all of them when FullView (not a Scale, and the
	// walk succeeded); RequestManaged says the request body carried
	// metadata.managedFields, as a client that read the object sends it.
	// Created says the write created the object (201), whatever its verb:
	// a server-side apply creates with a PATCH.
	ObjectVersion  uint64
	Created        bool
	Fields         Fields
	FullView       bool
	RequestManaged bool

	// Raw is the event as received with secret objects removed; it is kept
	// only when the raw column is enabled.
	Raw string

	// Fingerprint hashes the event's stable semantic fields; see Fingerprint.
	Fingerprint uint64
}

// Writer is the effective writer: the impersonated user when present.
func (r *Row) Writer() string {
	if r.ImpersonatedUser != "" {
		return r.ImpersonatedUser
	}
	return r.User
}

// WriterGroups are the effective writer's groups: the impersonated user's
// when there is one, as admission sees them.
func (r *Row) WriterGroups() []string {
	if r.ImpersonatedUser != "" {
		return r.ImpersonatedGroups
	}
	return r.UserGroups
}

// Counted reports whether this is the one event of its request that counts:
// ResponseComplete, or Panic for a request that never completed.
func (r *Row) Counted() bool { return r.Stage == StageResponseComplete || r.Stage == StagePanic }

// Success is a 2xx answer: the write was applied (or dry-run).
func (r *Row) Success() bool { return r.Code >= 200 && r.Code < 300 }

// HasRequest reports whether the event's level logs the request body.
func (r *Row) HasRequest() bool { return r.Level == LevelRequest || r.Level == LevelRequestResponse }

// HasResponse reports whether the event's level logs the response body.
func (r *Row) HasResponse() bool { return r.Level == LevelRequestResponse }

// Fingerprint hashes the fields that identify one request's event however it
// was delivered (log file or webhook, first try or retry), so the same event
// deduplicates while a reused Audit-ID of a different request does not.
func Fingerprint(r *Row) uint64 {
	h := fnv64(fnvOffset, uint64(r.RequestReceivedMicros))
	h = fnv64(h, uint64(r.StageMicros))
	h = fnv64(h, uint64(uint32(r.Code)))
	h = fnvString(h, r.Verb)
	h = fnvString(h, r.RequestURI)
	h = fnvString(h, r.User)
	return h
}

// FNV-1a, 64 bit, written out so hashing allocates nothing.
const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)

func fnv64(h, v uint64) uint64 {
	for range 8 {
		h ^= v & 0xff
		h *= fnvPrime
		v >>= 8
	}
	return h
}

func fnvString(h uint64, s string) uint64 {
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= fnvPrime
	}
	h ^= 0 // terminator keeps ("ab","c") apart from ("a","bc")
	return h * fnvPrime
}

// DeadLetter is an input that could not become a Row, kept with the reason.
type DeadLetter struct {
	Cluster    string
	Source     string
	Reason     string
	Raw        string
	ReceivedAt int64 // Unix microseconds
}

// RawHash is the FNV-1a hash of the dead letter's Raw (the raw_hash column
// of dead_letters).
func (d *DeadLetter) RawHash() uint64 { return fnvString(fnvOffset, d.Raw) }
