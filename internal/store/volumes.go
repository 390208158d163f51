package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/core"
)

// Volume records: one JSON document beside the columns a lookup uses. A
// name is unique per owner.
const volumeSchema = `
CREATE TABLE IF NOT EXISTS volumes (
	id         TEXT PRIMARY KEY,
	owner      TEXT NOT NULL,
	name       TEXT NOT NULL,
	created_at INTEGER NOT NULL,
	record     TEXT NOT NULL,
	UNIQUE (owner, name)
);
`

var _ core.VolumeStore = (*DB)(nil)

// PutVolume inserts or replaces a volume record; a new one whose name its
// owner already has is errdefs.ErrAlreadyExists.
func (d *DB) PutVolume(ctx context.Context, v core.Volume) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("put volume %s: %w", v.ID, err)
	}
	_, err = d.exec(ctx, `INSERT INTO volumes (id, owner, name, created_at, record) VALUES (?,?,?,?,?)
		ON CONFLICT (id) DO UPDATE SET owner = excluded.owner, name = excluded.name, record = excluded.record`,
		v.ID, v.Owner, v.Name, unixNano(v.CreatedAt), string(b))
	if err != nil && strings.Contains(err.Error(), "UNIQUE constraint failed") {
		return fmt.Errorf("volume %q exists: %w", v.Name, errdefs.ErrAlreadyExists)
	}
	if err != nil {
		return fmt.Errorf("put volume %s: %w", v.ID, err)
	}
	return nil
}

func (d *DB) getVolume(ctx context.Context, what, q string, args ...any) (core.Volume, error) {
	var v core.Volume
	var rec string
	err := d.rd.QueryRowContext(ctx, `SELECT record FROM volumes WHERE `+q, args...).Scan(&rec)
	if errors.Is(err, sql.ErrNoRows) {
		return v, fmt.Errorf("volume %s: %w", what, errdefs.ErrNotFound)
	}
	if err != nil {
		return v, fmt.Errorf("get volume %s: %w", what, err)
	}
	if err := json.Unmarshal([]byte(rec), &v); err != nil {
		return v, fmt.Errorf("get volume %s: %w", what, err)
	}
	return v, nil
}

// GetVolume returns one volume, or an error wrapping errdefs.ErrNotFound.
func (d *DB) GetVolume(ctx context.Context, id string) (core.Volume, error) {
	return d.getVolume(ctx, id, `id = ?`, id)
}

// VolumeByName returns owner's volume called name, or an error wrapping
// errdefs.ErrNotFound.
func (d *DB) VolumeByName(ctx context.Context, owner, name string) (core.Volume, error) {
	return d.getVolume(ctx, fmt.Sprintf("%q", name), `owner = ? AND name = ?`, owner, name)
}

// ListVolumes returns every volume, oldest first.
func (d *DB) ListVolumes(ctx context.Context) ([]core.Volume, error) {
	rows, err := d.rd.QueryContext(ctx, `SELECT record FROM volumes ORDER BY created_at, id`)
	if err != nil {
		return nil, fmt.Errorf("list volumes: %w", err)
	}
	defer rows.Close()
	var out []core.Volume
	for rows.Next() {
		var rec string
		if err := rows.Scan(&rec); err != nil {
			return nil, fmt.Errorf("list volumes: %w", err)
		}
		var v core.Volume
		if err := json.Unmarshal([]byte(rec), &v); err != nil {
			return nil, fmt.Errorf("list volumes: %w", err)
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

// DeleteVolume removes a volume record.
func (d *DB) DeleteVolume(ctx context.Context, id string) error {
	res, err := d.exec(ctx, `DELETE FROM volumes WHERE id = ?`, id)
	if err != nil {
		return fmt.Errorf("delete volume %s: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("volume %s: %w", id, errdefs.ErrNotFound)
	}
	return nil
}
