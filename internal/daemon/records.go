package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/sandbox"
)

// DefaultRetention is how long stopped and failed sandboxes' records and
// logs are kept.
const DefaultRetention = 24 * time.Hour

// recordStore is what records need from the store.
type recordStore interface {
	DeleteSandbox(ctx context.Context, id string) error
	EndedBefore(ctx context.Context, t time.Time) ([]string, error)
}

// logRemover deletes a sandbox's log files.
type logRemover interface {
	Remove(id string) error
}

// records removes ended sandboxes' records with their logs: on request
// (`berth rm`) and once they are older than the retention, so a busy
// daemon's list does not grow without end.
type records struct {
	mgr       *sandbox.Manager
	store     recordStore
	logs      []logRemover
	retention time.Duration
	log       *slog.Logger
}

// Remove deletes an ended sandbox's record, events and logs; a live one is
// refused (kill it first).
func (r *records) Remove(ctx context.Context, id string) error {
	sb, err := r.mgr.Get(ctx, id)
	if err != nil {
		return err
	}
	if st := sandbox.State(sb.State); st != sandbox.StateStopped && st != sandbox.StateFailed {
		return fmt.Errorf("sandbox %s is %s: kill it before removing its record: %w", id, sb.State, errdefs.ErrFailedPrecondition)
	}
	return r.remove(ctx, id)
}

func (r *records) remove(ctx context.Context, id string) error {
	var errs []error
	for _, l := range r.logs {
		if err := l.Remove(id); err != nil {
			errs = append(errs, err)
		}
	}
	if err := r.store.DeleteSandbox(ctx, id); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// run removes expired records until ctx ends, checking at a fraction of the
// retention (at most every minute).
func (r *records) run(ctx context.Context) {
	every := min(r.retention/4, time.Minute)
	every = max(every, 100*time.Millisecond)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		r.sweep(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (r *records) sweep(ctx context.Context) {
	ids, err := r.store.EndedBefore(ctx, time.Now().Add(-r.retention))
	if err != nil {
		if ctx.Err() == nil {
			r.log.Warn("retention_list_failed", "err", err)
		}
		return
	}
	for _, id := range ids {
		if err := r.remove(ctx, id); err != nil {
			r.log.Warn("retention_remove_failed", "sandbox_id", id, "err", err)
			continue
		}
		r.log.Info("record_expired", "sandbox_id", id, "retention", r.retention)
	}
}
