package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/core"
)

// Snapshot records (issue 14). The record is one JSON document beside the
// columns a listing sorts and filters on: it is read whole and never
// queried by its inner fields.
const snapshotSchema = `
CREATE TABLE IF NOT EXISTS snapshots (
	id         TEXT PRIMARY KEY,
	name       TEXT NOT NULL,
	source     TEXT NOT NULL,
	created_at INTEGER NOT NULL,
	record     TEXT NOT NULL
);
`

var _ core.SnapshotStore = (*DB)(nil)

// migrateSnapshots creates the snapshots table (Open runs it).
func migrateSnapshots(ctx context.Context, db *sql.DB) error {
	_, err := db.ExecContext(ctx, snapshotSchema)
	return err
}

// PutSnapshot inserts or replaces a snapshot record.
func (d *DB) PutSnapshot(ctx context.Context, s core.Snapshot) error {
	b, err := json.Marshal(s)
	if err != nil {
		return fmt.Errorf("put snapshot %s: %w", s.ID, err)
	}
	_, err = d.exec(ctx, `INSERT OR REPLACE INTO snapshots (id, name, source, created_at, record) VALUES (?,?,?,?,?)`,
		s.ID, s.Name, s.Source, unixNano(s.CreatedAt), string(b))
	if err != nil {
		return fmt.Errorf("put snapshot %s: %w", s.ID, err)
	}
	return nil
}

// GetSnapshot returns one snapshot, or an error wrapping errdefs.ErrNotFound.
func (d *DB) GetSnapshot(ctx context.Context, id string) (core.Snapshot, error) {
	var s core.Snapshot
	var rec string
	err := d.rd.QueryRowContext(ctx, `SELECT record FROM snapshots WHERE id = ?`, id).Scan(&rec)
	if errors.Is(err, sql.ErrNoRows) {
		return s, fmt.Errorf("snapshot %s: %w", id, errdefs.ErrNotFound)
	}
	if err != nil {
		return s, fmt.Errorf("get snapshot %s: %w", id, err)
	}
	if err := json.Unmarshal([]byte(rec), &s); err != nil {
		return s, fmt.Errorf("get snapshot %s: %w", id, err)
	}
	return s, nil
}

// ListSnapshots returns every snapshot, oldest first.
func (d *DB) ListSnapshots(ctx context.Context) ([]core.Snapshot, error) {
	rows, err := d.rd.QueryContext(ctx, `SELECT record FROM snapshots ORDER BY created_at, id`)
	if err != nil {
		return nil, fmt.Errorf("list snapshots: %w", err)
	}
	defer rows.Close()
	var out []core.Snapshot
	for rows.Next() {
		var rec string
		if err := rows.Scan(&rec); err != nil {
			return nil, fmt.Errorf("list snapshots: %w", err)
		}
		var s core.Snapshot
		if err := json.Unmarshal([]byte(rec), &s); err != nil {
			return nil, fmt.Errorf("list snapshots: %w", err)
		}
		out = append(out, s)
	}
	return out, rows.Err()
}

// DeleteSnapshot removes a snapshot record.
func (d *DB) DeleteSnapshot(ctx context.Context, id string) error {
	res, err := d.exec(ctx, `DELETE FROM snapshots WHERE id = ?`, id)
	if err != nil {
		return fmt.Errorf("delete snapshot %s: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("snapshot %s: %w", id, errdefs.ErrNotFound)
	}
	return nil
}
