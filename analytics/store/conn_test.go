package store

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/ClickHouse/clickhouse-go/v2/lib/proto"

	"github.com/stampguard/stampguard/test/chdbtest"
	"github.com/stampguard/stampguard/test/testenv"
)

func TestSettingsFor(t *testing.T) {
	legacy := []string{"allow_experimental_low_cardinality_type", "low_cardinality_allow_in_native_format"}
	for _, c := range []struct {
		name string
		v    proto.Version
		want []string
	}{
		{"18.16, Debian's, needs LowCardinality enabled", proto.Version{Major: 18, Minor: 16, Patch: 1}, legacy},
		{"a 1.1.54xxx release is older still", proto.Version{Major: 1, Minor: 1, Patch: 54390}, legacy},
		{"26.7 refuses the experimental setting: send nothing", proto.Version{Major: 26, Minor: 7, Patch: 2}, nil},
		{"a release after 26.7 gets what 26.7 gets", proto.Version{Major: 27, Minor: 1}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := slices.Sorted(maps.Keys(settingsFor(c.v))); !slices.Equal(got, c.want) {
				t.Fatalf("settingsFor(%v) sends %v, want %v", c.v, got, c.want)
			}
		})
	}
}

// TestSettingsKnownToClickHouse26 checks the settings against ClickHouse 26.7
// itself (chDB): what the store sends a current server exists there, and
// what it withholds from one is what 26.7 refuses. The native protocol
// cannot run against chDB, so this is how the connection settings of a
// current server are proven.
func TestSettingsKnownToClickHouse26(t *testing.T) {
	testenv.SkipIfShort(t, "loads ClickHouse 26.7 (chDB)")
	e := chdbtest.Open(t)
	known := func(name string) bool {
		out, err := e.Query("SELECT count() FROM system.settings WHERE name = '"+name+"'", "")
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(out) == "1"
	}
	current := settingsFor(proto.Version{Major: 26, Minor: 7, Patch: 2})
	for name := range current {
		if !known(name) {
			t.Errorf("the store sends %s to 26.7, which does not know it", name)
		}
	}
	for name, v := range settingsFor(proto.Version{Major: 18, Minor: 16, Patch: 1}) {
		if _, sent := current[name]; sent {
			continue
		}
		_, err := e.Query(fmt.Sprintf("SELECT 1 SETTINGS %s = %v", name, v), "")
		if known(name) != (err == nil) {
			t.Errorf("%s: in system.settings %v, accepted in a query: %v", name, known(name), err)
		}
		if name == "allow_experimental_low_cardinality_type" && (err == nil || !strings.Contains(err.Error(), "Code: 115")) {
			t.Errorf("26.7 accepted %s (%v): it need not be withheld any more", name, err)
		}
	}
}

// TestStoreSettingsOnClickHouse18 proves, on a real 18.16, that the store's
// queries carry the settings its version needs, and that opening a store
// needs no server: a sink starts while ClickHouse is away.
func TestStoreSettingsOnClickHouse18(t *testing.T) {
	testenv.SkipIfShort(t, "starts clickhouse-server")
	ctx := t.Context()
	srv := chtestStart(t)
	port := srv.Port
	srv.Stop()
	away, err := Open(ctx, Options{DSN: srv.DSN()})
	if err != nil {
		t.Fatalf("open with the server away: %v", err)
	}
	defer away.Close()
	if err := away.Conn().Ping(ctx); err == nil || !strings.Contains(err.Error(), "server version") {
		t.Fatalf("ping with the server away: %v, want an error reading the server version", err)
	}
	srv.Start()
	if srv.Port != port {
		t.Fatal("the server came back on another port")
	}
	for _, st := range []*Store{away, mustOpen(t, srv.DSN())} {
		for name, want := range map[string]string{"allow_experimental_low_cardinality_type": "1", "low_cardinality_allow_in_native_format": "0"} {
			var got string
			if err := st.Conn().QueryRow(ctx, "SELECT value FROM system.settings WHERE name = ?", name).Scan(&got); err != nil {
				t.Fatal(err)
			}
			if got != want {
				t.Errorf("%s = %s on 18.16, want %s", name, got, want)
			}
		}
	}
}

func mustOpen(t *testing.T, dsn string) *Store {
	st, err := Open(t.Context(), Options{DSN: dsn})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}
