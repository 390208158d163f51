package store

import (
	"context"
	"fmt"
	"time"
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
	rows, err := d.db.QueryContext(ctx, `SELECT id FROM sandboxes WHERE state IN ('stopped','failed') AND ended_at > 0 AND ended_at < ?`, unixNano(t))
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
