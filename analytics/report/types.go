// Package report computes stampguard's conflict analytics over the events
// table and renders them as a terminal table or as JSON.
package report

// Report is the JSON contract of `auditsink report --format json`. Keys are
// stable; new keys may be added.
type Report struct {
	Window              Window              `json:"window"`
	Totals              Totals              `json:"totals"`
	ConflictsByUser     []UserConflicts     `json:"conflicts_by_user"`
	ConflictsByResource []ResourceConflicts `json:"conflicts_by_resource"`
	HotObjects          []HotObject         `json:"hot_objects"`
	RetryLoops          []RetryLoop         `json:"retry_loops"`
	StamplessUpdates    []StamplessUpdates  `json:"stampless_updates"`
	LeaseHolderChanges  []LeaseChanges      `json:"lease_holder_changes"`
	PolicyDecisions     []PolicyDecisions   `json:"policy_decisions"`
	LostUpdates         []LostUpdate        `json:"lost_updates"`
	FieldFights         []FieldFight        `json:"field_fights"`
	ConflictCauses      []ConflictCause     `json:"conflict_causes"`
	NoopWrites          []NoopWrites        `json:"noop_writes"`
	FieldWriters        []FieldWriter       `json:"field_writers"`
}

// Window is the half-open interval [Since, Until), RFC3339 with microseconds.
type Window struct {
	Since string `json:"since"`
	Until string `json:"until"`
}

// Totals count requests in the window; each request counts once.
type Totals struct {
	Requests                    uint64  `json:"requests"`
	WriteAttempts               uint64  `json:"write_attempts"`
	VersionConflicts            uint64  `json:"version_conflicts"`
	FieldConflicts              uint64  `json:"field_conflicts"`
	AlreadyExists               uint64  `json:"already_exists"`
	DeletePreconditionConflicts uint64  `json:"delete_precondition_conflicts"`
	StamplessUpdates            uint64  `json:"stampless_updates"`
	OtherConflicts              uint64  `json:"other_conflicts"`
	Gone                        uint64  `json:"gone"`
	ConflictRate                float64 `json:"conflict_rate"`
}

// UserConflicts is one writer's attempts and version conflicts.
type UserConflicts struct {
	User             string `json:"user"`
	WriteAttempts    uint64 `json:"write_attempts"`
	VersionConflicts uint64 `json:"version_conflicts"`
}

// ResourceConflicts is one resource's attempts and version conflicts.
type ResourceConflicts struct {
	APIGroup         string `json:"api_group"`
	Resource         string `json:"resource"`
	WriteAttempts    uint64 `json:"write_attempts"`
	VersionConflicts uint64 `json:"version_conflicts"`
}

// HotObject is an object ranked by version conflicts, then distinct
// writers, then write attempts.
type HotObject struct {
	APIGroup         string `json:"api_group"`
	Resource         string `json:"resource"`
	Namespace        string `json:"namespace"`
	Name             string `json:"name"`
	WriteAttempts    uint64 `json:"write_attempts"`
	DistinctWriters  uint64 `json:"distinct_writers"`
	VersionConflicts uint64 `json:"version_conflicts"`
}

// RetryLoop is a maximal run of version conflicts by one writer on one object.
type RetryLoop struct {
	User      string `json:"user"`
	APIGroup  string `json:"api_group"`
	Resource  string `json:"resource"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Conflicts uint64 `json:"conflicts"`
	First     string `json:"first"`
	Last      string `json:"last"`
	Resolved  bool   `json:"resolved"`
}

// StamplessUpdates counts one writer's successful updates without a stamp on one object.
type StamplessUpdates struct {
	User      string `json:"user"`
	APIGroup  string `json:"api_group"`
	Resource  string `json:"resource"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Count     uint64 `json:"count"`
}

// LeaseChanges is one lease's holder changes and the holders seen, in order.
type LeaseChanges struct {
	Namespace string   `json:"namespace"`
	Name      string   `json:"name"`
	Changes   uint64   `json:"changes"`
	Holders   []string `json:"holders"`
}

// PolicyDecisions counts stampguard audit annotations by policy, rule kind
// and action (deny, warn, audit = would have denied).
type PolicyDecisions struct {
	Policy string `json:"policy"`
	Kind   string `json:"kind"`
	Action string `json:"action"`
	Count  uint64 `json:"count"`
}

// LostUpdate is a write that changed a field another writer had set,
// without having seen that value (analytics/sql.LostCause): the change
// overwritten, by whom, and how.
type LostUpdate struct {
	APIGroup           string `json:"api_group"`
	Resource           string `json:"resource"`
	Namespace          string `json:"namespace"`
	Name               string `json:"name"`
	Field              string `json:"field"`
	Writer             string `json:"writer"`
	OverwrittenWriter  string `json:"overwritten_writer"`
	Cause              string `json:"cause"`
	AuditID            string `json:"audit_id"`
	OverwrittenAuditID string `json:"overwritten_audit_id"`
	Time               string `json:"time"`
	OverwrittenTime    string `json:"overwritten_time"`
}

// FieldFight is a field of one object that changed hands between writers
// again and again in the window.
type FieldFight struct {
	APIGroup  string   `json:"api_group"`
	Resource  string   `json:"resource"`
	Namespace string   `json:"namespace"`
	Name      string   `json:"name"`
	Field     string   `json:"field"`
	Writers   []string `json:"writers"`
	Changes   uint64   `json:"changes"`
	Handoffs  uint64   `json:"handoffs"`
	First     string   `json:"first"`
	Last      string   `json:"last"`
}

// ConflictCause counts the version conflicts of Writer that writes of
// BlockedBy caused ("" when the history holds none of them).
type ConflictCause struct {
	Writer    string `json:"writer"`
	BlockedBy string `json:"blocked_by"`
	Conflicts uint64 `json:"conflicts"`
}

// NoopWrites counts one writer's writes that stored nothing.
type NoopWrites struct {
	User  string `json:"user"`
	Count uint64 `json:"count"`
}

// FieldWriter is a writer that changed a field of objects of one kind in
// one namespace: how often, on how many objects, first and last.
type FieldWriter struct {
	APIGroup  string `json:"api_group"`
	Resource  string `json:"resource"`
	Namespace string `json:"namespace"`
	Field     string `json:"field"`
	Writer    string `json:"writer"`
	Changes   uint64 `json:"changes"`
	Objects   uint64 `json:"objects"`
	First     string `json:"first"`
	Last      string `json:"last"`
}
