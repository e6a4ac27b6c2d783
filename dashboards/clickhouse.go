package dashboards

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/cog/variants"
	"github.com/grafana/grafana-foundation-sdk/go/common"
)

// PluginID is the Grafana ClickHouse data source plugin.
const PluginID = "grafana-clickhouse-datasource"

// Format is how the plugin's backend shapes a result (grafana-plugin-sdk-go
// data/sqlutil's numbering).
type Format int

// The formats the dashboards use.
const (
	FormatTimeSeries Format = 0
	FormatTable      Format = 1
)

// ClickHouseQuery is the plugin's query model for raw SQL
// (grafana/clickhouse-datasource src/types/sql.ts, CHSqlQuery). The SDK has
// no ClickHouse package; this is its dataquery variant.
type ClickHouseQuery struct {
	RefId      string                `json:"refId"`
	Datasource *common.DataSourceRef `json:"datasource,omitempty"`
	Hide       *bool                 `json:"hide,omitempty"`
	// EditorType is "sql": the panel shows rawSql, not the query builder.
	EditorType string `json:"editorType"`
	// QueryType is "table" or "timeseries".
	QueryType string `json:"queryType"`
	RawSql    string `json:"rawSql"`
	Format    Format `json:"format"`
}

var _ variants.Dataquery = (*ClickHouseQuery)(nil)

// ImplementsDataqueryVariant marks ClickHouseQuery as a dataquery.
func (*ClickHouseQuery) ImplementsDataqueryVariant() {}

// DataqueryType is the plugin id.
func (*ClickHouseQuery) DataqueryType() string { return PluginID }

// Equals compares two queries.
func (q *ClickHouseQuery) Equals(other variants.Dataquery) bool {
	o, ok := other.(*ClickHouseQuery)
	return ok && reflect.DeepEqual(q, o)
}

// Validate checks what the plugin needs to run the query.
func (q *ClickHouseQuery) Validate() error {
	var errs []error
	if q.RefId == "" {
		errs = append(errs, errors.New("refId: empty"))
	}
	if q.EditorType != "sql" {
		errs = append(errs, fmt.Errorf("editorType: %q, want sql", q.EditorType))
	}
	if q.QueryType != "table" && q.QueryType != "timeseries" {
		errs = append(errs, fmt.Errorf("queryType: %q, want table or timeseries", q.QueryType))
	}
	if q.Format != FormatTable && q.Format != FormatTimeSeries {
		errs = append(errs, fmt.Errorf("format: %d, want 0 (time series) or 1 (table)", q.Format))
	}
	if q.RawSql == "" {
		errs = append(errs, errors.New("rawSql: empty"))
	}
	if q.Datasource != nil && (q.Datasource.Type == nil || *q.Datasource.Type != PluginID) {
		errs = append(errs, fmt.Errorf("datasource: not of type %s", PluginID))
	}
	return errors.Join(errs...)
}

// UnmarshalJSONStrict decodes a query, refusing unknown fields.
func (q *ClickHouseQuery) UnmarshalJSONStrict(raw []byte) error {
	d := json.NewDecoder(bytes.NewReader(raw))
	d.DisallowUnknownFields()
	if err := d.Decode(q); err != nil {
		return fmt.Errorf("clickhouse query: %w", err)
	}
	return nil
}

// ClickHouseVariant registers ClickHouseQuery with the SDK's runtime, so
// that dashboards and alert rules decode their ClickHouse targets into it:
// cog.NewRuntime().RegisterDataqueryVariant(ClickHouseVariant()).
func ClickHouseVariant() variants.DataqueryConfig {
	return variants.DataqueryConfig{
		Identifier: PluginID,
		DataqueryUnmarshaler: func(raw []byte) (variants.Dataquery, error) {
			q := &ClickHouseQuery{}
			return q, json.Unmarshal(raw, q)
		},
		StrictDataqueryUnmarshaler: func(raw []byte) (variants.Dataquery, error) {
			q := &ClickHouseQuery{}
			return q, q.UnmarshalJSONStrict(raw)
		},
	}
}

// clickHouseQuery builds a ClickHouseQuery: a cog.Builder for panel
// targets and alert query models.
type clickHouseQuery struct{ q ClickHouseQuery }

var _ cog.Builder[variants.Dataquery] = clickHouseQuery{}

func (b clickHouseQuery) Build() (variants.Dataquery, error) {
	q := b.q
	if err := q.Validate(); err != nil {
		// The SDK's builders expect cog.BuildErrors.
		return nil, cog.MakeBuildErrors("clickhouse", err)
	}
	return &q, nil
}

// newClickHouseQuery is a raw-SQL query of the given shape on ds.
func newClickHouseQuery(refID string, ds common.DataSourceRef, series bool, sql string) clickHouseQuery {
	q := ClickHouseQuery{RefId: refID, Datasource: &ds, EditorType: "sql", QueryType: "table", RawSql: strings.TrimSpace(sql), Format: FormatTable}
	if series {
		q.QueryType, q.Format = "timeseries", FormatTimeSeries
	}
	return clickHouseQuery{q}
}

// DashboardDatasource is Grafana's "-- Dashboard --" data source (type
// "datasource", the SDK's datasource.Dataquery): a panel on it shows
// another panel's query results, so that one query feeds several panels.
const DashboardDatasource = "-- Dashboard --"
