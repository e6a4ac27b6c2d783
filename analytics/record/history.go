package record

// HistoryRow is one row of the field_versions table: a write's field
// history with what identifies the write and how it was based.
type HistoryRow struct {
	Cluster, AuditID, Stage                 string
	Fingerprint                             uint64
	APIGroup, Resource, Namespace, Name     string
	StageMicros, ReceivedMicros             int64
	Verb, Subresource, Writer, FieldManager string
	Stamp                                   string
	History
}

// The positions of the strings Histories reads.
var (
	strVerb         = stringPos(colVerb)
	strSubresource  = stringPos(colSubresource)
	strFieldManager = stringPos(colFieldManager)
	strStamp        = stringPos(colStamp)
)

// Histories calls fn with the field history of every row that has one, in
// the events' order. The HistoryRow is reused from call to call, but what
// it holds is not: its strings are the events' and its Paths and Hashes
// are allocated for the call, so fn may keep them.
func (e Events) Histories(fn func(*HistoryRow) error) error {
	var h HistoryRow
	var strs [rowStrings]string
	for _, i := range e.order {
		r := &e.rows[i]
		if r.hist == 0 {
			continue
		}
		d := recordReader{s: r.rec, i: r.off}
		for k := range strs {
			strs[k] = d.str()
		}
		for range rowLists {
			for k := d.count(); k > 0; k-- {
				d.skipStr()
			}
		}
		t := d.tail()
		d.i = r.hist
		d.readHistory(&h.History, true)
		if d.err != nil {
			return d.err
		}
		h.Cluster, h.AuditID, h.Stage, h.Fingerprint = r.key.cluster, r.key.auditID, r.key.stage, r.key.fingerprint
		h.APIGroup, h.Resource, h.Namespace, h.Name = r.apiGroup, r.resource, r.namespace, r.name
		h.StageMicros, h.ReceivedMicros = t.stage, t.received
		h.Verb, h.Subresource, h.FieldManager, h.Stamp = strs[strVerb], strs[strSubresource], strs[strFieldManager], strs[strStamp]
		h.Writer = strs[strImpersonated]
		if h.Writer == "" {
			h.Writer = strs[strUser]
		}
		if err := fn(&h); err != nil {
			return err
		}
	}
	return nil
}
