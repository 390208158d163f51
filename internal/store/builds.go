package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/core"
)

// E2B template builds and their logs (issue 15). A build's log is a table
// of its own, one row per line numbered from 0, so a status poll reads
// the lines from its offset on without loading the whole log.
const buildSchema = `
CREATE TABLE IF NOT EXISTS template_builds (
	id          TEXT PRIMARY KEY,
	template    TEXT NOT NULL,
	target      TEXT NOT NULL,
	tags        TEXT NOT NULL,
	status      TEXT NOT NULL,
	reason      TEXT NOT NULL DEFAULT '',
	reason_step TEXT NOT NULL DEFAULT '',
	created_at  INTEGER NOT NULL,
	updated_at  INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS template_builds_template ON template_builds(template, created_at);
CREATE INDEX IF NOT EXISTS template_builds_status ON template_builds(status);
CREATE TABLE IF NOT EXISTS template_build_logs (
	build_id TEXT NOT NULL,
	n        INTEGER NOT NULL,
	time     INTEGER NOT NULL,
	level    TEXT NOT NULL,
	message  TEXT NOT NULL,
	step     TEXT NOT NULL DEFAULT '',
	PRIMARY KEY (build_id, n)
) WITHOUT ROWID;
`

var _ core.TemplateBuildStore = (*DB)(nil)

// migrateBuilds creates the build tables (Open runs it).
func migrateBuilds(ctx context.Context, db *sql.DB) error {
	_, err := db.ExecContext(ctx, buildSchema)
	return err
}

// PutTemplateBuild inserts or replaces a build record.
func (d *DB) PutTemplateBuild(ctx context.Context, b core.TemplateBuild) error {
	tags, err := json.Marshal(b.Tags)
	if err != nil {
		return fmt.Errorf("put build %s: %w", b.ID, err)
	}
	_, err = d.exec(ctx, `INSERT OR REPLACE INTO template_builds (id, template, target, tags, status, reason, reason_step, created_at, updated_at) VALUES (?,?,?,?,?,?,?,?,?)`,
		b.ID, b.Template, b.Target, string(tags), b.Status, b.Reason, b.ReasonStep, unixNano(b.CreatedAt), unixNano(b.UpdatedAt))
	if err != nil {
		return fmt.Errorf("put build %s: %w", b.ID, err)
	}
	return nil
}

// GetTemplateBuild returns one build, or an error wrapping
// errdefs.ErrNotFound.
func (d *DB) GetTemplateBuild(ctx context.Context, id string) (core.TemplateBuild, error) {
	var b core.TemplateBuild
	var tags string
	var created, updated int64
	err := d.rd.QueryRowContext(ctx, `SELECT id, template, target, tags, status, reason, reason_step, created_at, updated_at FROM template_builds WHERE id = ?`, id).
		Scan(&b.ID, &b.Template, &b.Target, &tags, &b.Status, &b.Reason, &b.ReasonStep, &created, &updated)
	if errors.Is(err, sql.ErrNoRows) {
		return b, fmt.Errorf("build %s: %w", id, errdefs.ErrNotFound)
	}
	if err != nil {
		return b, fmt.Errorf("get build %s: %w", id, err)
	}
	if err := json.Unmarshal([]byte(tags), &b.Tags); err != nil {
		return b, fmt.Errorf("build %s tags: %w", id, err)
	}
	b.CreatedAt, b.UpdatedAt = fromNano(created), fromNano(updated)
	return b, nil
}

// AppendBuildLog stores entries as lines from, from+1, … of build id, in
// one write.
func (d *DB) AppendBuildLog(ctx context.Context, id string, from int, entries []core.BuildLogEntry) error {
	if len(entries) == 0 {
		return nil
	}
	q := `INSERT OR IGNORE INTO template_build_logs (build_id, n, time, level, message, step) VALUES `
	args := make([]any, 0, 6*len(entries))
	for i, e := range entries {
		if i > 0 {
			q += ","
		}
		q += "(?,?,?,?,?,?)"
		args = append(args, id, from+i, unixNano(e.Time), e.Level, e.Message, e.Step)
	}
	if _, err := d.exec(ctx, q, args...); err != nil {
		return fmt.Errorf("append log of build %s: %w", id, err)
	}
	return nil
}

func (d *DB) buildLog(ctx context.Context, id, q string, arg int) ([]core.BuildLogEntry, error) {
	rows, err := d.rd.QueryContext(ctx, q, id, arg)
	if err != nil {
		return nil, fmt.Errorf("log of build %s: %w", id, err)
	}
	defer rows.Close()
	out := []core.BuildLogEntry{}
	for rows.Next() {
		var e core.BuildLogEntry
		var t int64
		if err := rows.Scan(&t, &e.Level, &e.Message, &e.Step); err != nil {
			return nil, fmt.Errorf("log of build %s: %w", id, err)
		}
		e.Time = fromNano(t)
		out = append(out, e)
	}
	return out, rows.Err()
}

// BuildLog returns build id's lines from line from on.
func (d *DB) BuildLog(ctx context.Context, id string, from int) ([]core.BuildLogEntry, error) {
	return d.buildLog(ctx, id, `SELECT time, level, message, step FROM template_build_logs WHERE build_id = ? AND n >= ? ORDER BY n`, from)
}

// BuildLogTail returns build id's last n lines, oldest first.
func (d *DB) BuildLogTail(ctx context.Context, id string, n int) ([]core.BuildLogEntry, error) {
	return d.buildLog(ctx, id, `SELECT time, level, message, step FROM (
		SELECT n, time, level, message, step FROM template_build_logs WHERE build_id = ? ORDER BY n DESC LIMIT ?) ORDER BY n`, n)
}

// InterruptBuilds marks every build still building as error with reason.
func (d *DB) InterruptBuilds(ctx context.Context, reason string, at time.Time) (int, error) {
	res, err := d.exec(ctx, `UPDATE template_builds SET status = 'error', reason = ?, reason_step = '', updated_at = ? WHERE status = 'building'`, reason, unixNano(at))
	if err != nil {
		return 0, fmt.Errorf("interrupt builds: %w", err)
	}
	n, _ := res.RowsAffected()
	return int(n), nil
}

// PruneBuilds removes template's builds but the newest keep (and those
// building), with their logs, in one transaction.
func (d *DB) PruneBuilds(ctx context.Context, template string, keep int) error {
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("prune builds of %s: %w", template, err)
	}
	defer func() { _ = tx.Rollback() }() // a no-op after Commit
	const old = `SELECT id FROM template_builds WHERE template = ? AND status != 'building' AND id NOT IN (
		SELECT id FROM template_builds WHERE template = ? ORDER BY created_at DESC, id DESC LIMIT ?)`
	for _, q := range []string{
		`DELETE FROM template_build_logs WHERE build_id IN (` + old + `)`,
		`DELETE FROM template_builds WHERE id IN (` + old + `)`,
	} {
		if _, err := tx.ExecContext(ctx, q, template, template, keep); err != nil {
			return fmt.Errorf("prune builds of %s: %w", template, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("prune builds of %s: %w", template, err)
	}
	return nil
}
