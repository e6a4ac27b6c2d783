package record

import (
	"encoding/binary"
	"fmt"
	"unsafe"

	"github.com/stampguard/stampguard/analytics/audit"
)

// A row's layout in its record is defined here, once: first its strings
// (rowStringFields), then its string lists (rowListFields), in this order,
// each with the Row field it holds and the events column it fills; then
// its rowTail. AppendRow (Row to record), Set.add (record to key) and
// block.appendRow (record to columns) all follow these tables, so a new
// field is one row here (and its column in columns.go's columnTable).
//
// A string is its length (uvarint) and its bytes; a list is its length
// and its strings.

// rowField is one string (or one list) of a row: where the Row holds it
// and the events column it fills. An offset rather than an accessor
// function keeps the encoders free of a call per field (about a tenth of
// AppendRow's time); TestRowLayoutNamesRowFields checks each offset.
type rowField struct {
	off uintptr // of the field in audit.Row
	col int     // its column in columnTable
}

// str is the string field f of r.
func (f rowField) str(r *audit.Row) *string { return (*string)(unsafe.Add(unsafe.Pointer(r), f.off)) }

// list is the list field f of r.
func (f rowField) list(r *audit.Row) *[]string {
	return (*[]string)(unsafe.Add(unsafe.Pointer(r), f.off))
}

var layoutRow audit.Row // only for unsafe.Offsetof

var rowStringFields = [...]rowField{
	{unsafe.Offsetof(layoutRow.AuditID), colAuditID},
	{unsafe.Offsetof(layoutRow.Stage), colStage},
	{unsafe.Offsetof(layoutRow.Level), colLevel},
	{unsafe.Offsetof(layoutRow.Verb), colVerb},
	{unsafe.Offsetof(layoutRow.RequestURI), colRequestURI},
	{unsafe.Offsetof(layoutRow.User), colUser},
	{unsafe.Offsetof(layoutRow.ImpersonatedUser), colImpersonatedUser},
	{unsafe.Offsetof(layoutRow.UserAgent), colUserAgent},
	{unsafe.Offsetof(layoutRow.SourceIP), colSourceIP},
	{unsafe.Offsetof(layoutRow.APIGroup), colAPIGroup},
	{unsafe.Offsetof(layoutRow.APIVersion), colAPIVersion},
	{unsafe.Offsetof(layoutRow.Resource), colResource},
	{unsafe.Offsetof(layoutRow.Subresource), colSubresource},
	{unsafe.Offsetof(layoutRow.Namespace), colNamespace},
	{unsafe.Offsetof(layoutRow.Name), colName},
	{unsafe.Offsetof(layoutRow.ObjectUID), colObjectUID},
	{unsafe.Offsetof(layoutRow.Stamp), colStamp},
	{unsafe.Offsetof(layoutRow.FieldManager), colFieldManager},
	{unsafe.Offsetof(layoutRow.Reason), colReason},
	{unsafe.Offsetof(layoutRow.Message), colMessage},
	{unsafe.Offsetof(layoutRow.AuthzDecision), colAuthzDecision},
	{unsafe.Offsetof(layoutRow.LeaseHolder), colLeaseHolder},
	{unsafe.Offsetof(layoutRow.Raw), colRaw}, // empty unless the store keeps raw
}

var rowListFields = [...]rowField{
	{unsafe.Offsetof(layoutRow.UserGroups), colUserGroups},
	{unsafe.Offsetof(layoutRow.CauseReasons), colCauseReasons},
	{unsafe.Offsetof(layoutRow.CauseFields), colCauseFields},
	{unsafe.Offsetof(layoutRow.AnnotationKeys), colAnnotationKeys},
	{unsafe.Offsetof(layoutRow.AnnotationValues), colAnnotationValues},
}

// The number of strings and string lists of a row.
const (
	rowStrings = len(rowStringFields)
	rowLists   = len(rowListFields)
)

// rowTail is what follows a row's lists in its record: the flags (bit 0:
// DryRun) and Code, RequestReceivedMicros, StageMicros as varints, then
// the Fingerprint as 8 bytes little endian.
type rowTail struct {
	flags                 uint64
	code, received, stage int64
	fingerprint           uint64
}

func tailOf(r *audit.Row) rowTail {
	t := rowTail{code: int64(r.Code), received: r.RequestReceivedMicros, stage: r.StageMicros, fingerprint: r.Fingerprint}
	if r.DryRun {
		t.flags = 1
	}
	return t
}

func (t rowTail) appendTo(dst []byte) []byte {
	dst = binary.AppendUvarint(dst, t.flags)
	dst = binary.AppendVarint(dst, t.code)
	dst = binary.AppendVarint(dst, t.received)
	dst = binary.AppendVarint(dst, t.stage)
	return binary.LittleEndian.AppendUint64(dst, t.fingerprint)
}

func (d *recordReader) tail() rowTail {
	return rowTail{flags: d.uvarint(), code: d.varint(), received: d.varint(), stage: d.varint(), fingerprint: d.uint64()}
}

func (t rowTail) setOn(r *audit.Row) {
	r.DryRun = t.flags&1 == 1
	r.Code = int32(t.code)
	r.RequestReceivedMicros = t.received
	r.StageMicros = t.stage
	r.Fingerprint = t.fingerprint
}

// What Set.add keeps of a row's strings (keyRoles, by position).
const (
	keySkip = iota
	keyAuditID
	keyStage
	keyAPIGroup
	keyResource
	keyNamespace
	keyName
)

var keyRoles = func() (roles [rowStrings]uint8) {
	for role, col := range map[uint8]int{keyAuditID: colAuditID, keyStage: colStage, keyAPIGroup: colAPIGroup,
		keyResource: colResource, keyNamespace: colNamespace, keyName: colName} {
		roles[stringPos(col)] = role
	}
	return roles
}()

// The positions of the strings block.appendRow reads by name.
var (
	strUser         = stringPos(colUser)
	strImpersonated = stringPos(colImpersonatedUser)
)

// stringPos is the position of column col's string in a row's record.
func stringPos(col int) int {
	for i, f := range rowStringFields {
		if f.col == col {
			return i
		}
	}
	panic(fmt.Sprintf("record: column %d is no string of a row's record", col))
}
