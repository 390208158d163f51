package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

// Writes go through one goroutine that commits them in groups: whoever
// asks to write while a commit is under way waits for the next one, which
// takes every write queued by then (up to maxGroup) in one transaction.
// SQLite allows one writer at a time anyway; what grouping saves is the
// per-transaction cost (lock, WAL frames, commit record), which a burst of
// creates paid once per statement, each statement queued behind the
// others for the single connection. Reads use their own connections
// (WAL lets them run beside the writer), so a GET never waits for a
// queue of writes.

// maxGroup bounds one transaction, so a flood of writes still commits
// (and answers its callers) in steps.
const maxGroup = 128

// maxPrepared bounds the writer's prepared statements.
const maxPrepared = 64

// writeReq is one caller's write: its statements commit together, in
// order, or not at all.
type writeReq struct {
	ctx   context.Context
	stmts []stmt
	res   []result
	err   error
	done  chan struct{}
}

// stmt is one write statement and its arguments.
type stmt struct {
	query string
	args  []any
}

// result is a sql.Result read inside the transaction.
type result struct{ lastID, rows int64 }

func (r result) LastInsertId() (int64, error) { return r.lastID, nil }
func (r result) RowsAffected() (int64, error) { return r.rows, nil }

// exec runs one write statement through the group committer and returns
// once its group committed (or failed).
func (d *DB) exec(ctx context.Context, query string, args ...any) (sql.Result, error) {
	res, err := d.execAll(ctx, stmt{query, args})
	if err != nil {
		return nil, err
	}
	return res[0], nil
}

// execAll runs stmts, in order, in one transaction through the group
// committer, and returns their results once it committed (or failed).
func (d *DB) execAll(ctx context.Context, stmts ...stmt) ([]result, error) {
	req := &writeReq{ctx: ctx, stmts: stmts, done: make(chan struct{})}
	select {
	case d.writes <- req:
	case <-d.closed:
		return nil, errors.New("store is closed")
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	// Once queued the write is the writer's: it commits or fails it, and
	// the caller learns which even if its context ends meanwhile, so a
	// write never happens behind the back of a caller told it did not.
	<-req.done
	return req.res, req.err
}

// writer is the group committer's loop; it ends when the DB is closed.
// writes is unbuffered, so every write it accepted is in a group it
// commits.
func (d *DB) writer() {
	defer close(d.writerDone)
	for {
		var group []*writeReq
		select {
		case r := <-d.writes:
			group = append(group, r)
		case <-d.closed:
			for _, ps := range d.prepared {
				_ = ps.Close()
			}
			return
		}
	more:
		for len(group) < maxGroup {
			select {
			case r := <-d.writes:
				group = append(group, r)
			default:
				break more
			}
		}
		d.commit(group)
	}
}

// commit writes group in one transaction. If any statement fails, the
// transaction is rolled back and each write is retried in a transaction
// of its own, so one bad write fails only its own caller.
func (d *DB) commit(group []*writeReq) {
	live := group[:0:0]
	for _, r := range group {
		if err := r.ctx.Err(); err != nil {
			r.err = err
			close(r.done)
			continue
		}
		live = append(live, r)
	}
	if len(live) == 0 {
		return
	}
	if len(live) > 1 {
		if err := d.commitTx(live); err == nil {
			for _, r := range live {
				close(r.done)
			}
			return
		}
	}
	for _, r := range live {
		if err := d.commitTx([]*writeReq{r}); err != nil {
			r.err = err
		}
		close(r.done)
	}
}

func (d *DB) commitTx(group []*writeReq) (err error) {
	// The writes' own contexts bound only their wait in the queue: a
	// group must not half-commit because one caller went away.
	ctx := context.Background()
	// Statements are prepared once, on the writer's one connection, and
	// before the transaction takes it: SQLite compiles a statement on
	// every unprepared exec, about 15 % of a create's write
	// (bench_test.go). Queries built per call (a build log's rows) would
	// grow the cache without end, so it stops at maxPrepared and the rest
	// run unprepared.
	for _, r := range group {
		for _, st := range r.stmts {
			if _, ok := d.prepared[st.query]; ok || len(d.prepared) >= maxPrepared {
				continue
			}
			ps, err := d.db.PrepareContext(ctx, st.query)
			if err != nil {
				return err
			}
			d.prepared[st.query] = ps
		}
	}
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	for _, r := range group {
		r.res = make([]result, len(r.stmts))
		for i, st := range r.stmts {
			var res sql.Result
			if ps := d.prepared[st.query]; ps != nil {
				res, err = tx.StmtContext(ctx, ps).ExecContext(ctx, st.args...)
			} else {
				res, err = tx.ExecContext(ctx, st.query, st.args...)
			}
			if err != nil {
				return err
			}
			r.res[i].lastID, _ = res.LastInsertId()
			r.res[i].rows, _ = res.RowsAffected()
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}
