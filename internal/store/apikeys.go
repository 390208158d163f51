package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/core"
)

const apiKeySchema = `
CREATE TABLE IF NOT EXISTS api_keys (
	id         TEXT PRIMARY KEY,
	name       TEXT NOT NULL,
	hash       TEXT NOT NULL UNIQUE,
	mask       TEXT NOT NULL,
	created_at INTEGER NOT NULL,
	revoked_at INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS e2b_sandboxes (
	id             TEXT PRIMARY KEY,
	traffic_token  TEXT NOT NULL DEFAULT '',
	network        TEXT NOT NULL DEFAULT '{}'
);
`

// sandboxColumns are the columns added to sandboxes after the first schema:
// each is added by migrate when an older database lacks it.
var sandboxColumns = []struct{ name, decl string }{
	{"owner", `TEXT NOT NULL DEFAULT ''`},
	{"metadata", `TEXT NOT NULL DEFAULT '{}'`},
	{"agent_user", `TEXT NOT NULL DEFAULT ''`},
	// Every sandbox before isolation levels ran under runc.
	{"isolation", `TEXT NOT NULL DEFAULT 'runc'`},
	{"runtime_version", `TEXT NOT NULL DEFAULT ''`},
	{"allow_sudo", `INTEGER NOT NULL DEFAULT 0`},
	{"volumes", `TEXT NOT NULL DEFAULT '[]'`},
}

// apiKeyColumns are the columns added to api_keys after its first schema
// (migration "api_keys admin and quotas"), added like sandboxColumns.
var apiKeyColumns = []struct{ name, decl string }{
	{"admin", `INTEGER NOT NULL DEFAULT 0`},
	{"max_sandboxes", `INTEGER NOT NULL DEFAULT 0`},
	{"max_cpu_millis", `INTEGER NOT NULL DEFAULT 0`},
	{"max_memory_bytes", `INTEGER NOT NULL DEFAULT 0`},
	{"max_volume_bytes", `INTEGER NOT NULL DEFAULT 0`},
	{"max_timeout_ns", `INTEGER NOT NULL DEFAULT 0`},
}

// tableColumns returns the columns table has.
func tableColumns(ctx context.Context, db *sql.DB, table string) (map[string]bool, error) {
	have := map[string]bool{}
	rows, err := db.QueryContext(ctx, `PRAGMA table_info(`+table+`)`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var (
			cid         int
			name, typ   string
			notnull, pk int
			dflt        sql.NullString
		)
		if err := rows.Scan(&cid, &name, &typ, &notnull, &dflt, &pk); err != nil {
			return nil, err
		}
		have[name] = true
	}
	return have, rows.Err()
}

// migrateAPIKeys adds apiKeyColumns a database lacks.
func migrateAPIKeys(ctx context.Context, db *sql.DB) error {
	have, err := tableColumns(ctx, db, "api_keys")
	if err != nil {
		return err
	}
	for _, c := range apiKeyColumns {
		if have[c.name] {
			continue
		}
		if _, err := db.ExecContext(ctx, `ALTER TABLE api_keys ADD COLUMN `+c.name+` `+c.decl); err != nil {
			return fmt.Errorf("add column api_keys.%s: %w", c.name, err)
		}
	}
	return nil
}

// migrate brings a database created by an older Berth up to date. Every step
// is idempotent: ADD COLUMN runs only for a column the table lacks.
func migrate(ctx context.Context, db *sql.DB) error {
	if _, err := db.ExecContext(ctx, apiKeySchema); err != nil {
		return err
	}
	have := map[string]bool{}
	rows, err := db.QueryContext(ctx, `PRAGMA table_info(sandboxes)`)
	if err != nil {
		return err
	}
	for rows.Next() {
		var (
			cid         int
			name, typ   string
			notnull, pk int
			dflt        sql.NullString
		)
		if err := rows.Scan(&cid, &name, &typ, &notnull, &dflt, &pk); err != nil {
			rows.Close()
			return err
		}
		have[name] = true
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	for _, c := range slices.Concat(sandboxColumns, pauseColumns) {
		if have[c.name] {
			continue
		}
		if _, err := db.ExecContext(ctx, `ALTER TABLE sandboxes ADD COLUMN `+c.name+` `+c.decl); err != nil {
			return fmt.Errorf("add column sandboxes.%s: %w", c.name, err)
		}
	}
	if _, err = db.ExecContext(ctx, `CREATE INDEX IF NOT EXISTS sandboxes_owner ON sandboxes(owner)`); err != nil {
		return err
	}
	if err := migrateAPIKeys(ctx, db); err != nil {
		return err
	}
	return migrateUsage(ctx, db)
}

// PutAPIKey stores a new API key.
func (d *DB) PutAPIKey(ctx context.Context, k core.APIKey) error {
	_, err := d.exec(ctx, `INSERT INTO api_keys (`+apiKeyCols+`) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)`,
		k.ID, k.Name, k.Hash, k.Mask, unixNano(k.CreatedAt), unixNano(k.RevokedAt), boolInt(k.Admin),
		k.Quota.MaxSandboxes, k.Quota.MaxCPUMillis, k.Quota.MaxMemoryBytes, int64(k.Quota.MaxTimeout), k.Quota.MaxVolumeBytes)
	if err != nil {
		return fmt.Errorf("put api key %s: %w", k.ID, err)
	}
	return nil
}

const apiKeyCols = `id, name, hash, mask, created_at, revoked_at, admin, max_sandboxes, max_cpu_millis, max_memory_bytes, max_timeout_ns, max_volume_bytes`

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func scanAPIKey(r scanner) (core.APIKey, error) {
	var k core.APIKey
	var created, revoked, admin, maxTimeout int64
	err := r.Scan(&k.ID, &k.Name, &k.Hash, &k.Mask, &created, &revoked, &admin,
		&k.Quota.MaxSandboxes, &k.Quota.MaxCPUMillis, &k.Quota.MaxMemoryBytes, &maxTimeout, &k.Quota.MaxVolumeBytes)
	k.CreatedAt, k.RevokedAt = fromNano(created), fromNano(revoked)
	k.Admin, k.Quota.MaxTimeout = admin != 0, time.Duration(maxTimeout)
	return k, err
}

// GetAPIKey returns the key with the given ID, revoked or not, or an error
// wrapping errdefs.ErrNotFound.
func (d *DB) GetAPIKey(ctx context.Context, id string) (core.APIKey, error) {
	k, err := scanAPIKey(d.rd.QueryRowContext(ctx, `SELECT `+apiKeyCols+` FROM api_keys WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return k, fmt.Errorf("api key %s: %w", id, errdefs.ErrNotFound)
	}
	if err != nil {
		return k, fmt.Errorf("get api key %s: %w", id, err)
	}
	return k, nil
}

// SetAPIKeyQuota replaces an active key's quota.
func (d *DB) SetAPIKeyQuota(ctx context.Context, id string, q core.Quota) error {
	res, err := d.exec(ctx, `UPDATE api_keys SET max_sandboxes = ?, max_cpu_millis = ?, max_memory_bytes = ?, max_timeout_ns = ?, max_volume_bytes = ? WHERE id = ? AND revoked_at = 0`,
		q.MaxSandboxes, q.MaxCPUMillis, q.MaxMemoryBytes, int64(q.MaxTimeout), q.MaxVolumeBytes, id)
	if err != nil {
		return fmt.Errorf("update api key %s: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("api key %s (or it is revoked): %w", id, errdefs.ErrNotFound)
	}
	return nil
}

// APIKeyByHash returns the active (not revoked) key with the given hash, or
// an error wrapping errdefs.ErrNotFound.
func (d *DB) APIKeyByHash(ctx context.Context, hash string) (core.APIKey, error) {
	row := d.rd.QueryRowContext(ctx, `SELECT `+apiKeyCols+` FROM api_keys WHERE hash = ? AND revoked_at = 0`, hash)
	k, err := scanAPIKey(row)
	if errors.Is(err, sql.ErrNoRows) {
		return k, fmt.Errorf("api key: %w", errdefs.ErrNotFound)
	}
	if err != nil {
		return k, fmt.Errorf("get api key: %w", err)
	}
	return k, nil
}

// ListAPIKeys returns every key, revoked ones included, oldest first.
func (d *DB) ListAPIKeys(ctx context.Context) ([]core.APIKey, error) {
	rows, err := d.rd.QueryContext(ctx, `SELECT `+apiKeyCols+` FROM api_keys ORDER BY created_at, id`)
	if err != nil {
		return nil, fmt.Errorf("list api keys: %w", err)
	}
	defer rows.Close()
	var out []core.APIKey
	for rows.Next() {
		k, err := scanAPIKey(rows)
		if err != nil {
			return nil, fmt.Errorf("list api keys: %w", err)
		}
		out = append(out, k)
	}
	return out, rows.Err()
}

// RevokeAPIKey marks a key revoked; it stops authenticating at once. The
// record stays so that the sandboxes it created still name their owner.
func (d *DB) RevokeAPIKey(ctx context.Context, id string, at time.Time) error {
	res, err := d.exec(ctx, `UPDATE api_keys SET revoked_at = ? WHERE id = ? AND revoked_at = 0`, unixNano(at), id)
	if err != nil {
		return fmt.Errorf("revoke api key %s: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("api key %s (or it is already revoked): %w", id, errdefs.ErrNotFound)
	}
	return nil
}

// PutE2BSandbox inserts or replaces a sandbox's E2B attributes.
func (d *DB) PutE2BSandbox(ctx context.Context, s core.E2BSandbox) error {
	if s.Network == "" {
		s.Network = "{}"
	}
	_, err := d.exec(ctx, `INSERT OR REPLACE INTO e2b_sandboxes (id, traffic_token, network) VALUES (?,?,?)`,
		s.ID, s.TrafficToken, s.Network)
	if err != nil {
		return fmt.Errorf("put e2b sandbox %s: %w", s.ID, err)
	}
	return nil
}

// GetE2BSandbox returns a sandbox's E2B attributes; a sandbox created through
// another API has none and gets the zero value (with its ID) and no error.
func (d *DB) GetE2BSandbox(ctx context.Context, id string) (core.E2BSandbox, error) {
	s := core.E2BSandbox{ID: id, Network: "{}"}
	err := d.rd.QueryRowContext(ctx, `SELECT traffic_token, network FROM e2b_sandboxes WHERE id = ?`, id).Scan(&s.TrafficToken, &s.Network)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return s, fmt.Errorf("get e2b sandbox %s: %w", id, err)
	}
	return s, nil
}
