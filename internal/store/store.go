// Package store persists the daemon's state in SQLite (modernc.org/sqlite,
// pure Go): sandboxes and their lifecycle events, which are the core's
// records (DB implements core.Store). The schema is created and migrated
// on Open. A shared database (Postgres) can implement the same interface
// later so several nodes share one view.
package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/core"
	_ "modernc.org/sqlite" // registers the "sqlite" driver
)

// DB is the SQLite-backed store.
type DB struct {
	// db is the writer: one connection, used by the group committer
	// (writer.go) and by multi-statement transactions.
	db *sql.DB
	// rd serves reads, on connections of their own.
	rd *sql.DB

	// prepared holds the writer's statements, prepared once (writer
	// goroutine only).
	prepared map[string]*sql.Stmt

	writes     chan *writeReq
	closeOnce  sync.Once
	closed     chan struct{}
	writerDone chan struct{}
}

// The records are the core's; the store only keeps them.
var _ core.Store = (*DB)(nil)

const schema = `
CREATE TABLE IF NOT EXISTS sandboxes (
	id           TEXT PRIMARY KEY,
	state        TEXT NOT NULL,
	template     TEXT NOT NULL,
	cpu_millis   INTEGER NOT NULL,
	memory_bytes INTEGER NOT NULL,
	disk_bytes   INTEGER NOT NULL,
	pids_limit   INTEGER NOT NULL,
	env          TEXT NOT NULL,
	labels       TEXT NOT NULL,
	token        TEXT NOT NULL,
	created_at   INTEGER NOT NULL,
	deadline     INTEGER NOT NULL,
	ended_at     INTEGER NOT NULL DEFAULT 0,
	reason       TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS sandboxes_state ON sandboxes(state);
CREATE TABLE IF NOT EXISTS events (
	seq        INTEGER PRIMARY KEY AUTOINCREMENT,
	sandbox_id TEXT NOT NULL,
	time       INTEGER NOT NULL,
	type       TEXT NOT NULL,
	message    TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_sandbox ON events(sandbox_id, seq);
`

// Open opens (creating if needed) the database at path.
func Open(ctx context.Context, path string) (*DB, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("open store: %w", err)
	}
	dsn := "file:" + path + "?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)&_pragma=foreign_keys(1)"
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("open store %s: %w", path, err)
	}
	// One writer at a time keeps SQLite free of SQLITE_BUSY under load.
	db.SetMaxOpenConns(1)
	if _, err := db.ExecContext(ctx, schema); err != nil {
		db.Close()
		return nil, fmt.Errorf("migrate store %s: %w", path, err)
	}
	if err := migrate(ctx, db); err != nil {
		db.Close()
		return nil, fmt.Errorf("migrate store %s: %w", path, err)
	}
	if err := migrateSnapshots(ctx, db); err != nil {
		db.Close()
		return nil, fmt.Errorf("migrate store %s: %w", path, err)
	}
	if err := migrateBuilds(ctx, db); err != nil {
		db.Close()
		return nil, fmt.Errorf("migrate store %s: %w", path, err)
	}
	if _, err := db.ExecContext(ctx, volumeSchema); err != nil {
		db.Close()
		return nil, fmt.Errorf("migrate store %s: %w", path, err)
	}
	// Readers: WAL (set above, persistent in the file) lets them read
	// the last commit while the writer writes; query_only keeps them
	// readers.
	rd, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(5000)&_pragma=query_only(1)&_pragma=foreign_keys(1)")
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("open store %s: %w", path, err)
	}
	rd.SetMaxOpenConns(4)
	d := &DB{db: db, rd: rd, prepared: map[string]*sql.Stmt{}, writes: make(chan *writeReq), closed: make(chan struct{}), writerDone: make(chan struct{})}
	go d.writer()
	return d, nil
}

// Close closes the database. A write being committed completes first;
// later ones fail.
func (d *DB) Close() error {
	d.closeOnce.Do(func() { close(d.closed) })
	<-d.writerDone
	return errors.Join(d.rd.Close(), d.db.Close())
}

func unixNano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func fromNano(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n).UTC()
}

func encodeMap(m map[string]string) string {
	if len(m) == 0 {
		return "{}"
	}
	b, _ := json.Marshal(m) // a map of strings always marshals
	return string(b)
}

func decodeMap(s string) (map[string]string, error) {
	m := map[string]string{}
	if s == "" {
		return m, nil
	}
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		return nil, err
	}
	return m, nil
}

func encodeVolumes(v []core.VolumeMount) string {
	if len(v) == 0 {
		return "[]"
	}
	b, _ := json.Marshal(v) // strings and a bool always marshal
	return string(b)
}

// PutSandbox inserts or replaces a sandbox record.
func (d *DB) PutSandbox(ctx context.Context, s core.Sandbox) error {
	_, err := d.PutSandboxEvents(ctx, s)
	return err
}

// PutSandboxEvents inserts or replaces a sandbox record and appends evs
// after it, all in one transaction, and returns evs with their sequence
// numbers. A create's record and its events cost one commit, not one
// each.
func (d *DB) PutSandboxEvents(ctx context.Context, s core.Sandbox, evs ...core.Event) ([]core.Event, error) {
	stmts := []stmt{putSandbox(s)}
	for _, e := range evs {
		stmts = append(stmts, addEvent(e))
	}
	res, err := d.execAll(ctx, stmts...)
	if err != nil {
		return nil, fmt.Errorf("put sandbox %s: %w", s.ID, err)
	}
	out := slices.Clone(evs)
	for i := range out {
		out[i].Seq = res[i+1].lastID
	}
	return out, nil
}

func putSandbox(s core.Sandbox) stmt {
	return stmt{`INSERT OR REPLACE INTO sandboxes
		(id, state, template, cpu_millis, memory_bytes, disk_bytes, pids_limit, env, labels, token, created_at, deadline, ended_at, reason, owner, metadata, agent_user, isolation, runtime_version,
		 pause_kind, pause_remaining, on_timeout, auto_resume, idle_pause, allow_sudo, volumes)
		VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)`, []any{
		s.ID, s.State, s.Template, s.CPUMillis, s.MemoryBytes, s.DiskBytes, s.PidsLimit,
		encodeMap(s.Env), encodeMap(s.Labels), s.Token,
		unixNano(s.CreatedAt), unixNano(s.Deadline), unixNano(s.EndedAt), s.Reason,
		s.Owner, encodeMap(s.Metadata), s.User, isolationOrRunc(s.Isolation), s.RuntimeVersion,
		s.Pause, int64(s.Remaining), s.OnTimeout, s.AutoResume, int64(s.IdlePause), s.AllowSudo, encodeVolumes(s.Volumes)}}
}

const sandboxCols = `id, state, template, cpu_millis, memory_bytes, disk_bytes, pids_limit, env, labels, token, created_at, deadline, ended_at, reason, owner, metadata, agent_user, isolation, runtime_version,
	pause_kind, pause_remaining, on_timeout, auto_resume, idle_pause, allow_sudo, volumes`

// isolationOrRunc stores an unset isolation as runc, what a record that
// names none has always meant.
func isolationOrRunc(iso string) string {
	if iso == "" {
		return core.IsolationRunc
	}
	return iso
}

type scanner interface{ Scan(...any) error }

func scanSandbox(r scanner) (core.Sandbox, error) {
	var s core.Sandbox
	var env, labels, metadata, volumes string
	var created, deadline, ended, remaining, idle int64
	if err := r.Scan(&s.ID, &s.State, &s.Template, &s.CPUMillis, &s.MemoryBytes, &s.DiskBytes, &s.PidsLimit,
		&env, &labels, &s.Token, &created, &deadline, &ended, &s.Reason, &s.Owner, &metadata, &s.User, &s.Isolation, &s.RuntimeVersion,
		&s.Pause, &remaining, &s.OnTimeout, &s.AutoResume, &idle, &s.AllowSudo, &volumes); err != nil {
		return s, err
	}
	var err error
	if volumes != "" && volumes != "[]" {
		if err := json.Unmarshal([]byte(volumes), &s.Volumes); err != nil {
			return s, fmt.Errorf("sandbox %s volumes: %w", s.ID, err)
		}
	}
	if s.Env, err = decodeMap(env); err != nil {
		return s, fmt.Errorf("sandbox %s env: %w", s.ID, err)
	}
	if s.Labels, err = decodeMap(labels); err != nil {
		return s, fmt.Errorf("sandbox %s labels: %w", s.ID, err)
	}
	if s.Metadata, err = decodeMap(metadata); err != nil {
		return s, fmt.Errorf("sandbox %s metadata: %w", s.ID, err)
	}
	s.CreatedAt, s.Deadline, s.EndedAt = fromNano(created), fromNano(deadline), fromNano(ended)
	s.Remaining, s.IdlePause = time.Duration(remaining), time.Duration(idle)
	return s, nil
}

// GetSandbox returns one sandbox, or an error wrapping errdefs.ErrNotFound.
func (d *DB) GetSandbox(ctx context.Context, id string) (core.Sandbox, error) {
	row := d.rd.QueryRowContext(ctx, `SELECT `+sandboxCols+` FROM sandboxes WHERE id = ?`, id)
	s, err := scanSandbox(row)
	if errors.Is(err, sql.ErrNoRows) {
		return s, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	if err != nil {
		return s, fmt.Errorf("get sandbox %s: %w", id, err)
	}
	return s, nil
}

// ListSandboxes returns sandboxes whose state is one of states (all if none
// given), oldest first.
func (d *DB) ListSandboxes(ctx context.Context, states ...string) ([]core.Sandbox, error) {
	q := `SELECT ` + sandboxCols + ` FROM sandboxes`
	args := make([]any, 0, len(states))
	if len(states) > 0 {
		q += ` WHERE state IN (?` + strings.Repeat(",?", len(states)-1) + `)`
		for _, s := range states {
			args = append(args, s)
		}
	}
	q += ` ORDER BY created_at, id`
	rows, err := d.rd.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("list sandboxes: %w", err)
	}
	defer rows.Close()
	var out []core.Sandbox
	for rows.Next() {
		s, err := scanSandbox(rows)
		if err != nil {
			return nil, fmt.Errorf("list sandboxes: %w", err)
		}
		out = append(out, s)
	}
	return out, rows.Err()
}

// AddEvent appends a lifecycle event and returns it with its sequence number.
func (d *DB) AddEvent(ctx context.Context, e core.Event) (core.Event, error) {
	res, err := d.execAll(ctx, addEvent(e))
	if err != nil {
		return e, fmt.Errorf("add event for %s: %w", e.SandboxID, err)
	}
	e.Seq = res[0].lastID
	return e, nil
}

func addEvent(e core.Event) stmt {
	return stmt{`INSERT INTO events (sandbox_id, time, type, message) VALUES (?,?,?,?)`,
		[]any{e.SandboxID, unixNano(e.Time), e.Type, e.Message}}
}

// Events returns the events of one sandbox with a sequence number above
// after, oldest first.
func (d *DB) Events(ctx context.Context, sandboxID string, after int64) ([]core.Event, error) {
	rows, err := d.rd.QueryContext(ctx, `SELECT seq, sandbox_id, time, type, message FROM events
		WHERE sandbox_id = ? AND seq > ? ORDER BY seq`, sandboxID, after)
	if err != nil {
		return nil, fmt.Errorf("events of %s: %w", sandboxID, err)
	}
	defer rows.Close()
	var out []core.Event
	for rows.Next() {
		var e core.Event
		var t int64
		if err := rows.Scan(&e.Seq, &e.SandboxID, &t, &e.Type, &e.Message); err != nil {
			return nil, fmt.Errorf("events of %s: %w", sandboxID, err)
		}
		e.Time = fromNano(t)
		out = append(out, e)
	}
	return out, rows.Err()
}
