package report

import (
	"context"
	"fmt"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	asql "github.com/stampguard/stampguard/analytics/sql"

	"github.com/stampguard/stampguard/policy/api/annotation"
)

// Synthesize inserts n realistic audit rows for cluster into db.events,
// generated inside ClickHouse from a seed (the same seed gives the same
// rows), spread evenly over [start, start+span). It exists for benchmarks and
// load tests: 10 million rows take seconds, where sending them from Go
// would take minutes.
//
// The mix is skewed the way clusters are (Zipf-like: a uniform draw to the 4th power):
// a few namespaces and objects take most requests, and 90 % of an object's
// requests come from its one owning writer (its controller), the rest from
// writers drawn with the same skew. The mix: 60 % reads; writes are updates, patches, creates and deletes; 2 %
// of updates are version conflicts, concentrated on a few hundred hot
// objects with retry runs; 0.5 % of updates are stampless; a slice of the
// writes renew leases whose holders change now and then; 0.1 % carry a
// stampguard annotation; a few lists expire (410).
func Synthesize(ctx context.Context, conn driver.Conn, db, cluster string, n uint64, seed uint64, start time.Time, span time.Duration) error {
	if err := asql.ValidDatabase(db); err != nil {
		return err
	}
	startUS, spanUS := uint64(start.UnixMicro()), uint64(span.Microseconds())
	// h(k) is an independent pseudo-random 64-bit value per row and purpose.
	q := fmt.Sprintf(`
INSERT INTO %[1]s.events_by_hour (event_date, event_time, event_time_us, request_received_us, latency_us, cluster, audit_id, stage,
	fingerprint, level, verb, request_uri, dry_run, user, user_groups, impersonated_user, writer, user_agent, source_ip,
	api_group, api_version, resource, subresource, namespace, name, object_uid, stamp, field_manager, code, reason, message,
	cause_reasons, cause_fields, authz_decision, annotation_keys, annotation_values, lease_holder, raw)
SELECT toDate(toDateTime(intDiv(ts, 1000000)), 'UTC'), toDateTime(intDiv(ts, 1000000)), ts, ts - lat, lat, @cluster,
	concat('synth-', toString(@seed), '-', toString(number)), 'ResponseComplete', h1, 'Request', verb,
	concat('/apis/', grp, '/v1/namespaces/', ns, '/', res, '/', nm), toUInt8(h4 %% 1000 = 0),
	usr, ['system:authenticated'], '', usr, concat(usr, '/v1.37'), '10.0.0.1',
	grp, 'v1', res, '', ns, nm, toString(cityHash64(ns, nm)), stamp, '', code, reason, message,
	cause_reasons, [], 'allow', ann_keys, ann_values, holder, ''
`, db) + `FROM (` + synthRows + `)`
	args := []any{named("cluster", cluster), named("seed", seed), named("start_us", startUS), named("span_us", spanUS), named("n", n)}
	if err := conn.Exec(ctx, q, args...); err != nil {
		return err
	}
	// The field history of the successful writes of configmaps and
	// deployments: versions in time order, three fields whose values
	// come from small sets (so writers overwrite and revert each other),
	// one of them a set-like list and one that comes and goes, and one
	// write in 25 followed by a no-op write of the same version by
	// another writer.
	h := fmt.Sprintf(`
INSERT INTO %[1]s.field_versions (event_date, cluster, api_group, resource, namespace, name, object_version, event_time_us, request_received_us,
	audit_id, stage, fingerprint, verb, subresource, writer, field_manager, stamp, full_view, request_managed, force, apply, created, field_paths, field_hashes)
SELECT toDate(toDateTime(intDiv(ts + copy * 1000, 1000000)), 'UTC'), @cluster, grp, res, ns, nm, number + 1, ts + copy * 1000, ts - lat + copy * 1000,
	concat('synth-', toString(@seed), '-', toString(number), if(copy = 1, '-noop', '')), 'ResponseComplete', h1 + copy, verb, '',
	if(copy = 1, concat(usr, '-again'), usr), if(h5 %% 11 = 0, 'kubectl-replace', ''), stamp, 1, toUInt8(h4 %% 2 = 0),
	toUInt8(verb = 'patch' AND h6 %% 7 = 0), toUInt8(verb = 'patch' AND h6 %% 3 = 0), toUInt8(verb = 'create'),
	arrayConcat(['data.a'], if(h7 %% 4 != 0, ['spec.replicas'], CAST([] AS Array(String))), if(h4 %% 2 = 0, ['metadata.finalizers[*]', 'metadata.finalizers[*]'], ['metadata.finalizers[*]'])),
	arrayConcat([1 + h6 %% 3], if(h7 %% 4 != 0, [10 + h7 %% 2], CAST([] AS Array(UInt64))), if(h4 %% 2 = 0, [100, 101], [100]))
`, db) + `FROM (` + synthRows + `)
ARRAY JOIN if(h2 % 25 = 0, [0, 1], [0]) AS copy
WHERE verb IN ('create', 'update', 'patch') AND code < 300 AND res IN ('configmaps', 'deployments') AND NOT is_lease AND h4 % 1000 != 0`
	return conn.Exec(ctx, h, args...)
}

// synthRows are Synthesize's rows before they become events: one per
// number, with the pseudo-random values and the columns drawn from them.
const synthRows = `
	SELECT number,
		intHash64(number + @seed * 1000003) AS h1, intHash64(h1) AS h2, intHash64(h2) AS h3, intHash64(h3) AS h4, intHash64(h4) AS h5, intHash64(h5) AS h6, intHash64(h6) AS h7,
		@start_us + intDiv(number * @span_us, @n) AS ts,
		200 + h5 % 5000 AS lat,
		h2 % 100 AS kind,
		h3 % 100 < 2 AS hot,
		is_lease,
		if(is_lease, 'coordination.k8s.io', ['', 'apps', 'batch', 'networking.k8s.io', 'example.com'][1 + h3 % 5]) AS grp,
		multiIf(is_lease, 'leases', hot, 'configmaps', ['configmaps', 'secrets', 'deployments', 'jobs', 'ingresses', 'widgets', 'services', 'pods'][1 + h4 % 8]) AS res,
		multiIf(is_lease, 'kube-system', hot, 'ns-hot', concat('ns-', toString(toUInt64(pow((h6 % 1000000) / 1000000, 4) * 20)))) AS ns,
		if(is_lease, concat('lease-', toString(h5 % 50)), concat('obj-', toString(if(hot, h1 % 4, toUInt64(pow((h7 % 1000000) / 1000000, 4) * 100))))) AS nm,
		kind >= 95 AND h1 % 3 = 0 AND NOT hot AS is_lease,
		concat(if(h2 % 4 = 0, 'system:serviceaccount:ns-', 'user-'), toString(multiIf(hot, h4 % 4, h4 % 100 < 90, cityHash64(res, ns, nm) % 200, toUInt64(pow((h4 % 1000000) / 1000000, 4) * 200)))) AS usr,
		multiIf(is_lease, 'update', kind < 40, 'get', kind < 55, 'list', kind < 60, 'watch', kind < 85, 'update', kind < 93, 'patch', kind < 97, 'create', 'delete') AS verb,
		verb = 'update' AND (hot AND h5 % 100 < 60 OR h5 % 1000 < 5) AS conflict,
		verb = 'list' AND h5 % 5000 = 0 AS gone,
		verb = 'update' AND NOT conflict AND h1 % 200 = 0 AS stampless,
		multiIf(conflict, 409, gone, 410, verb = 'create', 201, 200) AS code,
		multiIf(conflict, 'Conflict', gone, 'Expired', '') AS reason,
		multiIf(conflict, concat('Operation cannot be fulfilled on ', res, ' "', nm, '": the object has been modified; please apply your changes to the latest version and try again'),
			gone, 'The resourceVersion for the provided list is too old.', '') AS message,
		CAST([] AS Array(String)) AS cause_reasons,
		if(verb = 'update' AND NOT stampless, toString(h3 % 100000), '') AS stamp,
		if(is_lease, concat('holder-', toString((intDiv(number * 20, @n) + toUInt64(h4 % 100 = 0)) % 3)), '') AS holder,
		if(h3 % 1000 = 0, ['` + annotation.FieldOwnerKey + `'], CAST([] AS Array(String))) AS ann_keys,
		if(h3 % 1000 = 0, [concat('[{"policy":"p', toString(h4 % 3), '","rule":"fieldOwners[0]","action":"', ['Deny', 'Warn', 'Audit'][1 + h5 % 3], '","path":"spec.replicas","writer":"x"}]')], CAST([] AS Array(String))) AS ann_values
	FROM system.numbers LIMIT @n
`

func named(k string, v any) driver.NamedValue { return clickhouse.Named(k, v) }
