package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/core"
)

// DeleteSandbox removes a sandbox's record, its events and its E2B
// attributes. Removing an unknown ID is not an error.
func (d *DB) DeleteSandbox(ctx context.Context, id string) error {
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("delete sandbox %s: %w", id, err)
	}
	defer func() { _ = tx.Rollback() }() // a no-op after Commit
	for _, q := range []string{`DELETE FROM events WHERE sandbox_id = ?`, `DELETE FROM e2b_sandboxes WHERE id = ?`, `DELETE FROM sandboxes WHERE id = ?`} {
		if _, err := tx.ExecContext(ctx, q, id); err != nil {
			return fmt.Errorf("delete sandbox %s: %w", id, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("delete sandbox %s: %w", id, err)
	}
	return nil
}

// EndedBefore returns the IDs of stopped and failed sandboxes that ended
// before t.
func (d *DB) EndedBefore(ctx context.Context, t time.Time) ([]string, error) {
	rows, err := d.rd.QueryContext(ctx, `SELECT id FROM sandboxes WHERE state IN ('stopped','failed') AND ended_at > 0 AND ended_at < ?`, unixNano(t))
	if err != nil {
		return nil, fmt.Errorf("list ended sandboxes: %w", err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		out = append(out, id)
	}
	return out, rows.Err()
}

const usageSchema = `
CREATE TABLE IF NOT EXISTS usage (
	sandbox_id          TEXT PRIMARY KEY,
	owner               TEXT NOT NULL,
	cpu_ns              INTEGER NOT NULL,
	memory_byte_seconds REAL NOT NULL,
	memory_peak_bytes   INTEGER NOT NULL,
	disk_bytes          INTEGER NOT NULL,
	egress_bytes        INTEGER NOT NULL,
	seconds             REAL NOT NULL,
	started_at          INTEGER NOT NULL,
	updated_at          INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS usage_owner ON usage(owner);
`

// migrateUsage creates the usage table (migration "usage").
func migrateUsage(ctx context.Context, db *sql.DB) error {
	_, err := db.ExecContext(ctx, usageSchema)
	return err
}

// PutUsage inserts or replaces a sandbox's usage.
func (d *DB) PutUsage(ctx context.Context, u core.Usage) error {
	_, err := d.exec(ctx, `INSERT OR REPLACE INTO usage (sandbox_id, owner, cpu_ns, memory_byte_seconds, memory_peak_bytes, disk_bytes, egress_bytes, seconds, started_at, updated_at) VALUES (?,?,?,?,?,?,?,?,?,?)`,
		u.SandboxID, u.Owner, int64(u.CPU), u.MemoryByteSeconds, u.MemoryPeakBytes, u.DiskBytes, u.EgressBytes, u.Seconds, unixNano(u.StartedAt), unixNano(u.UpdatedAt))
	if err != nil {
		return fmt.Errorf("put usage %s: %w", u.SandboxID, err)
	}
	return nil
}

const usageCols = `sandbox_id, owner, cpu_ns, memory_byte_seconds, memory_peak_bytes, disk_bytes, egress_bytes, seconds, started_at, updated_at`

func scanUsage(r scanner) (core.Usage, error) {
	var u core.Usage
	var cpu, started, updated int64
	err := r.Scan(&u.SandboxID, &u.Owner, &cpu, &u.MemoryByteSeconds, &u.MemoryPeakBytes, &u.DiskBytes, &u.EgressBytes, &u.Seconds, &started, &updated)
	u.CPU, u.StartedAt, u.UpdatedAt = time.Duration(cpu), fromNano(started), fromNano(updated)
	return u, err
}

// GetUsage returns a sandbox's usage, or an error wrapping
// errdefs.ErrNotFound.
func (d *DB) GetUsage(ctx context.Context, id string) (core.Usage, error) {
	u, err := scanUsage(d.rd.QueryRowContext(ctx, `SELECT `+usageCols+` FROM usage WHERE sandbox_id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return u, fmt.Errorf("usage of %s: %w", id, errdefs.ErrNotFound)
	}
	if err != nil {
		return u, fmt.Errorf("get usage %s: %w", id, err)
	}
	return u, nil
}

// ListUsage returns the usage of every sandbox metered at or after since
// (all if zero), oldest first.
func (d *DB) ListUsage(ctx context.Context, since time.Time) ([]core.Usage, error) {
	rows, err := d.rd.QueryContext(ctx, `SELECT `+usageCols+` FROM usage WHERE updated_at >= ? ORDER BY started_at, sandbox_id`, unixNano(since))
	if err != nil {
		return nil, fmt.Errorf("list usage: %w", err)
	}
	defer rows.Close()
	var out []core.Usage
	for rows.Next() {
		u, err := scanUsage(rows)
		if err != nil {
			return nil, fmt.Errorf("list usage: %w", err)
		}
		out = append(out, u)
	}
	return out, rows.Err()
}
