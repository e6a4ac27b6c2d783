package store

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"time"

	chproto "github.com/ClickHouse/ch-go/proto"
	"github.com/ClickHouse/clickhouse-go/v2/lib/column"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/ClickHouse/clickhouse-go/v2/lib/proto"

	asql "github.com/stampguard/stampguard/analytics/sql"
)

// Engine is a ClickHouse engine in this process (internal/chdb's): it
// runs one statement and returns its output in a format; a statement may
// carry inline data after FORMAT, as in clickhouse-client.
type Engine interface {
	Query(sql []byte, format string) ([]byte, error)
}

// OpenLocal opens a Store on an engine in this process: the schema, the
// inserts and the queries of a server, through a driver.Conn (localConn)
// that sends each statement to the engine and reads its answers, and
// writes its inserts, in ClickHouse's Native format: the blocks of the
// native protocol, encoded and decoded by the driver's own columns. o
// names the database; a DSN or a ClickHouse cluster has no meaning here.
func OpenLocal(e Engine, o Options) (*Store, error) {
	if o.DSN != "" || o.ClickHouseCluster != "" {
		return nil, errors.New("a store on an engine in this process takes no DSN and no ClickHouse cluster")
	}
	if o.Database == "" {
		o.Database = "stampguard"
	}
	if err := asql.ValidDatabase(o.Database); err != nil {
		return nil, err
	}
	return &Store{conn: &localConn{e: e}, db: o.Database, raw: o.KeepRaw, events: asql.EventsTable}, nil
}

// localConn is a driver.Conn on an Engine. Queries bind their @name
// arguments as the driver does (bindNamed); answers come as Native
// blocks, which rows scan through the driver's columns (ScanRow), so a
// row scans into the same Go values as from a server. A batch builds the
// driver's block for the table's columns and inserts it as Native data
// (insertDataFormat).
//
// The engine runs one statement at a time and cannot cancel one: a
// canceled context stops the next statement, not the running one.
type localConn struct {
	// Conn is nil: it only keeps a driver release that adds a method
	// compiling. Every method of this release is implemented below.
	driver.Conn
	e Engine
}

var _ driver.Conn = (*localConn)(nil)

// run binds args into query and runs it on the engine, answering in
// format.
func (c *localConn) run(ctx context.Context, query, format string, args []any) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	q, err := bindNamed(query, args)
	if err != nil {
		return nil, err
	}
	return c.e.Query([]byte(q), format)
}

func (c *localConn) Contributors() []string { return nil }

func (c *localConn) ServerVersion() (*driver.ServerVersion, error) {
	out, err := c.e.Query([]byte("SELECT version()"), "TabSeparated")
	if err != nil {
		return nil, err
	}
	v := strings.TrimSpace(string(out))
	var n [3]uint64
	for i, part := range strings.SplitN(v, ".", 4)[:min(3, strings.Count(v, ".")+1)] {
		if n[i], err = strconv.ParseUint(part, 10, 64); err != nil {
			return nil, fmt.Errorf("engine version %q: %w", v, err)
		}
	}
	return &driver.ServerVersion{Name: "ClickHouse (in process)", DisplayName: "chDB",
		Version: proto.Version{Major: n[0], Minor: n[1], Patch: n[2]}}, nil
}

func (c *localConn) Select(context.Context, any, string, ...any) error {
	return errors.New("Select is not implemented on the in-process engine: use Query")
}

func (c *localConn) Query(ctx context.Context, query string, args ...any) (driver.Rows, error) {
	out, err := c.run(ctx, query, "Native", args)
	if err != nil {
		return nil, err
	}
	blocks, err := decodeNative(out)
	if err != nil {
		return nil, fmt.Errorf("read the engine's answer: %w", err)
	}
	return &localRows{blocks: blocks}, nil
}

func (c *localConn) QueryRow(ctx context.Context, query string, args ...any) driver.Row {
	rows, err := c.Query(ctx, query, args...)
	if err != nil {
		return errRow{err}
	}
	if !rows.Next() {
		return errRow{sql.ErrNoRows}
	}
	return rows.(*localRows)
}

func (c *localConn) PrepareBatch(ctx context.Context, query string, _ ...driver.PrepareBatchOption) (driver.Batch, error) {
	m := insertColumns.FindStringSubmatch(query)
	if m == nil {
		return nil, fmt.Errorf("the in-process engine batches only INSERT INTO db.table (columns), not %.80q", query)
	}
	table, names := m[1], strings.Split(m[2], ",")
	db, name, ok := strings.Cut(table, ".")
	if !ok {
		return nil, fmt.Errorf("batch into %s: name the database", table)
	}
	out, err := c.run(ctx, "SELECT name, type FROM system.columns WHERE database = @db AND table = @table", "TabSeparated",
		[]any{driver.NamedValue{Name: "db", Value: db}, driver.NamedValue{Name: "table", Value: name}})
	if err != nil {
		return nil, err
	}
	types := map[string]string{}
	for line := range strings.Lines(string(out)) {
		n, t, _ := strings.Cut(strings.TrimSuffix(line, "\n"), "\t")
		types[n] = t
	}
	block := newBlock()
	for i, n := range names {
		n = strings.TrimSpace(n)
		names[i] = n
		t, ok := types[n]
		if !ok {
			return nil, fmt.Errorf("batch into %s: no column %s", table, n)
		}
		if err := block.AddColumn(n, column.Type(t)); err != nil {
			return nil, fmt.Errorf("batch into %s: column %s: %w", table, n, err)
		}
	}
	return &localBatch{ctx: ctx, c: c, insert: "INSERT INTO " + table + " (" + strings.Join(names, ", ") + ")", block: block}, nil
}

// insertColumns matches the inserts the store batches.
var insertColumns = regexp.MustCompile(`(?is)^\s*INSERT\s+INTO\s+([A-Za-z0-9_.]+)\s*\(([^)]*)\)\s*$`)

func (c *localConn) Exec(ctx context.Context, query string, args ...any) error {
	_, err := c.run(ctx, query, "TabSeparated", args)
	return err
}

func (c *localConn) QueryFormat(ctx context.Context, format string, query string, args ...any) (io.ReadCloser, error) {
	out, err := c.run(ctx, query, format, args)
	if err != nil {
		return nil, err
	}
	return io.NopCloser(bytes.NewReader(out)), nil
}

func (c *localConn) InsertFormat(ctx context.Context, format string, query string, data io.Reader) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	b, err := io.ReadAll(data)
	if err != nil {
		return err
	}
	return c.insertDataFormat(strings.TrimSpace(query), format, b)
}

// insertData runs insert (INSERT INTO t (columns)) with data, a Native
// block of those columns.
func (c *localConn) insertData(insert string, data []byte) error {
	return c.insertDataFormat(insert, "Native", data)
}

// insertDataFormat runs insert with data in format. The data goes
// through a temporary file that the engine reads (the table function
// file): inline data after INSERT ... FORMAT Native was cut short by the
// engine on some blocks (26.7 answered CANNOT_READ_ALL_DATA for blocks
// that it read whole from a file).
func (c *localConn) insertDataFormat(insert, format string, data []byte) error {
	f, err := os.CreateTemp("", "stampguard-insert-*."+strings.ToLower(format))
	if err != nil {
		return fmt.Errorf("insert through a temporary file: %w", err)
	}
	defer os.Remove(f.Name())
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("insert through a temporary file: %w", err)
	}
	q := insert + " SELECT * FROM file(" + quote(f.Name()) + ", " + quote(format) + ")"
	_, err = c.e.Query([]byte(q), "TabSeparated")
	return err
}

//nolint:staticcheck // part of driver.Conn
func (c *localConn) AsyncInsert(ctx context.Context, query string, _ bool, args ...any) error {
	return c.Exec(ctx, query, args...)
}

func (c *localConn) Ping(ctx context.Context) error { return c.Exec(ctx, "SELECT 1") }

func (c *localConn) Stats() driver.Stats { return driver.Stats{} }

// Close closes nothing: the engine belongs to whoever opened it.
func (c *localConn) Close() error { return nil }

func newBlock() *proto.Block {
	b := proto.NewBlock()
	b.ServerContext.Timezone = time.UTC
	return b
}

// decodeNative reads the blocks of an answer in the Native format.
func decodeNative(b []byte) ([]*proto.Block, error) {
	src := bytes.NewReader(b)
	r := chproto.NewReader(src)
	var blocks []*proto.Block
	for src.Len() > 0 {
		block := newBlock()
		if err := block.Decode(r, 0); err != nil {
			return nil, err
		}
		blocks = append(blocks, block)
	}
	return blocks, nil
}

// localRows are the rows of an answer, block after block.
type localRows struct {
	blocks []*proto.Block
	b, row int // the current block, and the current row in it plus one
}

func (r *localRows) Next() bool {
	for r.b < len(r.blocks) {
		if r.row < r.blocks[r.b].Rows() {
			r.row++
			return true
		}
		r.b, r.row = r.b+1, 0
	}
	return false
}

func (r *localRows) Scan(dest ...any) error {
	if r.b >= len(r.blocks) || r.row == 0 {
		return errors.New("Scan without a current row: call Next first")
	}
	block := r.blocks[r.b]
	if len(block.Columns) != len(dest) {
		return fmt.Errorf("expected %d destination arguments in Scan, not %d", len(block.Columns), len(dest))
	}
	for i, d := range dest {
		if err := block.Columns[i].ScanRow(d, r.row-1); err != nil {
			return fmt.Errorf("column %s: %w", block.Columns[i].Name(), err)
		}
	}
	return nil
}

func (r *localRows) ScanStruct(any) error {
	return errors.New("ScanStruct is not implemented on the in-process engine: use Scan")
}

func (r *localRows) ColumnTypes() []driver.ColumnType {
	if len(r.blocks) == 0 {
		return nil
	}
	var types []driver.ColumnType
	for _, c := range r.blocks[0].Columns {
		types = append(types, columnType{c})
	}
	return types
}

func (r *localRows) Totals(...any) error { return errors.New("the in-process engine sends no totals") }

func (r *localRows) Columns() []string {
	if len(r.blocks) == 0 {
		return nil
	}
	return r.blocks[0].ColumnsNames()
}

func (r *localRows) Close() error  { return nil }
func (r *localRows) Err() error    { return nil } // the whole answer was read before the first row
func (r *localRows) HasData() bool { return len(r.blocks) > 0 && r.blocks[0].Rows() > 0 }

// columnType describes a column of an answer.
type columnType struct{ c column.Interface }

func (t columnType) Name() string             { return t.c.Name() }
func (t columnType) Nullable() bool           { _, ok := t.c.(*column.Nullable); return ok }
func (t columnType) ScanType() reflect.Type   { return t.c.ScanType() }
func (t columnType) DatabaseTypeName() string { return string(t.c.Type()) }

// localBatch is an INSERT into one table; each Flush (and Send) sends
// the rows appended since as one Native block (insertDataFormat).
type localBatch struct {
	ctx    context.Context
	c      *localConn
	insert string
	block  *proto.Block
	sent   bool
}

func (b *localBatch) Abort() error {
	if b.sent {
		return errors.New("batch has already been sent")
	}
	b.sent = true
	return nil
}

func (b *localBatch) Append(v ...any) error {
	if b.sent {
		return errors.New("batch has already been sent")
	}
	return b.block.Append(v...)
}

func (b *localBatch) AppendStruct(any) error {
	return errors.New("AppendStruct is not implemented on the in-process engine: use Append")
}

func (b *localBatch) Column(i int) driver.BatchColumn {
	if i < 0 || i >= len(b.block.Columns) {
		return badColumn{fmt.Errorf("batch has %d columns, not %d", len(b.block.Columns), i+1)}
	}
	return batchColumn{b.block.Columns[i]}
}

func (b *localBatch) Flush() error {
	if b.sent {
		return errors.New("batch has already been sent")
	}
	if b.block.Rows() == 0 {
		return nil
	}
	if err := b.ctx.Err(); err != nil {
		return err
	}
	var buf chproto.Buffer
	if err := b.block.Encode(&buf, 0); err != nil {
		return err
	}
	if err := b.c.insertData(b.insert, buf.Buf); err != nil {
		return err
	}
	b.block.Reset()
	return nil
}

func (b *localBatch) Send() error {
	if err := b.Flush(); err != nil {
		return err
	}
	b.sent = true
	return nil
}

func (b *localBatch) IsSent() bool                { return b.sent }
func (b *localBatch) Rows() int                   { return b.block.Rows() }
func (b *localBatch) Columns() []column.Interface { return b.block.Columns }
func (b *localBatch) Close() error {
	b.sent = true
	return nil
}

type batchColumn struct{ c column.Interface }

func (c batchColumn) Append(v any) error    { _, err := c.c.Append(v); return err }
func (c batchColumn) AppendRow(v any) error { return c.c.AppendRow(v) }

type badColumn struct{ err error }

func (c badColumn) Append(any) error    { return c.err }
func (c badColumn) AppendRow(any) error { return c.err }
