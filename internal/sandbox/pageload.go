package sandbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/runtime"
)

// PageLoader is the optional ability of a runtime whose restore returns
// before a sandbox's memory is all back (gVisor's background restore: the
// sandbox runs while its pages are read in, and a page touched before it
// is in waits for it) to say when the load has ended and how.
// WaitRestored returns nil once every page is in (at once where restores
// load everything before they return); a load that fails ends with the
// runtime killing the sandbox's processes, and the error says why. An
// error may also mean the runtime could not tell (the sandbox stopped
// meanwhile); asked again, a load that failed fails again.
type PageLoader interface {
	WaitRestored(ctx context.Context, id string) error
}

// pageLoad is the memory load of a sandbox restored (a resume) or started
// (from a snapshot's or a fork's image) from a memory image, which goes
// on after the runtime's restore returned. err is set before done closes.
type pageLoad struct {
	done chan struct{}
	err  error
}

// watchPageLoad follows the memory load of sandbox id, just restored or
// started from an image in rt. nil when rt cannot say (every load ended
// with its restore) or the Manager is closing.
func (m *Manager) watchPageLoad(rt Runtime, id string) *pageLoad {
	pl, ok := rt.(PageLoader)
	if !ok || !m.track() {
		return nil
	}
	l := &pageLoad{done: make(chan struct{})}
	go func() {
		defer m.wg.Done()
		l.err = pl.WaitRestored(m.life, id)
		close(l.done)
	}()
	return l
}

// cancelOnFailure calls cancel if the load fails before ctx ends: a wait
// for the sandbox's agent then ends at once instead of at its timeout
// (the runtime kills the sandbox's processes when its load fails).
func (l *pageLoad) cancelOnFailure(ctx context.Context, cancel context.CancelFunc) {
	if l == nil {
		return
	}
	go func() {
		select {
		case <-l.done:
			if l.err != nil {
				cancel()
			}
		case <-ctx.Done():
		}
	}()
}

// loadFailure is the load's error, wrapped for a create or resume that
// waited for the sandbox's agent meanwhile, if the load has ended with
// one; nil while it goes on or once it has succeeded.
func (l *pageLoad) loadFailure() error {
	if l == nil {
		return nil
	}
	select {
	case <-l.done:
		if l.err != nil {
			return fmt.Errorf("memory image load failed: %w", l.err)
		}
	default:
	}
	return nil
}

// confirmLoadTimeout bounds guardPageLoad's second question to the
// runtime, asked under the sandbox's operation lock.
const confirmLoadTimeout = time.Minute

// guardPageLoad ends sandbox e, which has just become ready (after what,
// a create or a resume) while its memory load l went on, if that load
// fails: the runtime has killed its processes, and the sandbox is
// destroyed with the load's error as its reason rather than found dead
// later with none. It acts only while e is still in the ready period it
// has now (a pause or destroy meanwhile ends the guard's business), and
// only on a failure the runtime reports twice or on a sandbox no longer
// running: an error that only says the runtime could not be asked leaves
// a running sandbox alone.
func (m *Manager) guardPageLoad(e *entry, l *pageLoad, after string) {
	if l == nil || !m.track() {
		return
	}
	run := e.cur.Load().run
	e.load.Store(&guardedLoad{l: l, run: run, after: after})
	rt := m.runtimeOf(e.cur.Load().rec)
	go func() {
		defer m.wg.Done()
		select {
		case <-m.life.Done():
			return
		case <-l.done:
		}
		if l.err == nil || errors.Is(l.err, context.Canceled) {
			return
		}
		ctx := m.life
		still := func() bool {
			if st := e.cur.Load(); st.closed || st.run != run || e.state() != StateReady {
				return false
			}
			if st, err := rt.Inspect(ctx, e.id); err == nil && st.Status != runtime.StatusRunning {
				return true
			}
			// Asked again: a load that failed says so at once, one still
			// going on answers when it ends (bounded: an answer that
			// does not come confirms nothing).
			pl, ok := rt.(PageLoader)
			if !ok {
				return false
			}
			wctx, cancel := context.WithTimeout(ctx, confirmLoadTimeout)
			defer cancel()
			return pl.WaitRestored(wctx, e.id) != nil && wctx.Err() == nil
		}
		reason := loadFailedReason(after, l.err)
		if err := m.destroyIf(ctx, e, reason, still); err != nil && ctx.Err() == nil && !errors.Is(err, errdefs.ErrNotFound) {
			m.log.Warn("destroy_after_load_failure", "sandbox_id", e.id, "err", err)
		}
	}()
}

// guardAdoptedLoad follows, as guardPageLoad, the memory load of ready
// sandbox e, which a restarted daemon has just adopted from runtime rt: a
// restore or a create from an image may have been loading its pages when
// the daemon stopped, and no one else would say why it died if that load
// failed. The runtime answers at once for a sandbox with nothing loading.
func (m *Manager) guardAdoptedLoad(e *entry, rt Runtime) {
	m.guardPageLoad(e, m.watchPageLoad(rt, e.id), "daemon restart")
}

// guardedLoad is a memory load guardPageLoad follows: l, started after
// what (a create, a resume) for the ready period run.
type guardedLoad struct {
	l     *pageLoad
	run   *running
	after string
}

// loadExitWait bounds how long the monitor, finding a sandbox dead while
// its memory load is followed, waits for the load's outcome.
const loadExitWait = 2 * time.Second

// loadFailure is why sandbox e's memory load failed, if the load
// guardPageLoad follows for its current ready period failed; "" when there
// is none, it went well, or it has not ended within loadExitWait. A load
// that fails has the runtime kill the sandbox, and the monitor may find
// it dead before the load's own watch returns: asked then, it waits for
// that watch, so the sandbox ends with the load's failure as its reason
// rather than a bare "init exited".
func (m *Manager) loadFailure(ctx context.Context, e *entry) string {
	g := e.load.Load()
	if g == nil || g.run != e.cur.Load().run {
		return ""
	}
	ctx, cancel := context.WithTimeout(ctx, loadExitWait)
	defer cancel()
	select {
	case <-g.l.done:
	case <-ctx.Done():
		return ""
	}
	if g.l.err == nil || errors.Is(g.l.err, context.Canceled) {
		return ""
	}
	return loadFailedReason(g.after, g.l.err)
}

// loadFailedReason is the end reason of a sandbox whose memory load,
// started after what, failed with err.
func loadFailedReason(after string, err error) string {
	return fmt.Sprintf("memory image load failed after the %s: %v", after, err)
}
