package workload

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	auditv1 "k8s.io/apiserver/pkg/apis/audit/v1"

	"github.com/stampguard/stampguard/analytics/report"
)

// ReadAuditLog decodes the apiserver's JSON-lines audit log.
func ReadAuditLog(path string) ([]auditv1.Event, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open audit log: %w", err)
	}
	defer f.Close()
	var out []auditv1.Event
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 1<<20), 16<<20)
	for n := 1; sc.Scan(); n++ {
		var ev auditv1.Event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return nil, fmt.Errorf("audit log line %d: %w", n, err)
		}
		out = append(out, ev)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read audit log: %w", err)
	}
	return out, nil
}

// WaitAudited reads the audit log until every recorded request has its
// ResponseComplete event (the apiserver may write it just after the client
// has its response) and returns all events of the log.
func (r *Result) WaitAudited(ctx context.Context) ([]auditv1.Event, error) {
	ctx, cancel := context.WithTimeoutCause(ctx, 30*time.Second, errors.New("the audit log lacks recorded requests"))
	defer cancel()
	for {
		evs, err := ReadAuditLog(r.AuditLogPath)
		if err != nil {
			return nil, err
		}
		done := map[string]bool{}
		for _, ev := range evs {
			if ev.Stage == auditv1.StageResponseComplete {
				done[string(ev.AuditID)] = true
			}
		}
		missing := 0
		for _, q := range r.Requests {
			if !done[q.AuditID] {
				missing++
			}
		}
		if missing == 0 {
			return evs, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%d of %d requests: %w", missing, len(r.Requests), context.Cause(ctx))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// TruthAt is Truth with each retry loop's First and Last taken from the
// stageTimestamp of the ResponseComplete event of its first and last
// conflict, the times `auditsink report` sees. Everything else in the truth
// comes from the client.
func (r *Result) TruthAt(events []auditv1.Event) (report.Report, error) {
	at := map[string]time.Time{}
	for _, ev := range events {
		if ev.Stage == auditv1.StageResponseComplete {
			at[string(ev.AuditID)] = ev.StageTimestamp.Time
		}
	}
	rep := r.Truth
	rep.RetryLoops = append([]report.RetryLoop(nil), r.Truth.RetryLoops...)
	for i, b := range r.Loops {
		first, ok1 := at[b.FirstAuditID]
		last, ok2 := at[b.LastAuditID]
		if !ok1 || !ok2 {
			return report.Report{}, fmt.Errorf("retry loop %d: audit log lacks %s or %s", i, b.FirstAuditID, b.LastAuditID)
		}
		rep.RetryLoops[i].First = first.UTC().Format(TimeFormat)
		rep.RetryLoops[i].Last = last.UTC().Format(TimeFormat)
	}
	return rep, nil
}
