package sandbox

import (
	"context"
	"sync"
	"time"

	"github.com/berth-sandbox/berth/internal/core"
)

// hub wakes followers of a sandbox's events when a new one is stored.
type hub struct {
	mu   sync.Mutex
	subs map[string]map[chan struct{}]struct{}
}

func newHub() *hub { return &hub{subs: map[string]map[chan struct{}]struct{}{}} }

func (h *hub) subscribe(id string) (chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	h.mu.Lock()
	if h.subs[id] == nil {
		h.subs[id] = map[chan struct{}]struct{}{}
	}
	h.subs[id][ch] = struct{}{}
	h.mu.Unlock()
	return ch, func() {
		h.mu.Lock()
		delete(h.subs[id], ch)
		if len(h.subs[id]) == 0 {
			delete(h.subs, id)
		}
		h.mu.Unlock()
	}
}

func (h *hub) notify(id string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for ch := range h.subs[id] {
		select {
		case ch <- struct{}{}:
		default: // a wake-up is already pending
		}
	}
}

// closeAll wakes every follower so it can notice the daemon is stopping.
func (h *hub) closeAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, subs := range h.subs {
		for ch := range subs {
			select {
			case ch <- struct{}{}:
			default:
			}
		}
	}
}

// event records a lifecycle event and wakes its followers. Failing to
// record is logged: it must not fail the lifecycle step itself.
func (m *Manager) event(ctx context.Context, id, typ, msg string) {
	_, err := m.deps.Store.AddEvent(context.WithoutCancel(ctx), newEvent(id, typ, msg))
	if err != nil {
		m.log.Error("record_event", "sandbox_id", id, "type", typ, "err", err)
		return
	}
	m.hub.notify(id)
}

// newEvent is an event of sandbox id, now.
func newEvent(id, typ, msg string) core.Event {
	return core.Event{SandboxID: id, Time: time.Now().UTC(), Type: typ, Message: msg}
}

// putWithEvents writes rec and appends evs after it in one store
// transaction: a create's record and its events cost one commit. The
// caller publishes the entry, then wakes the followers (m.hub.notify),
// so a follower woken by an event finds the record it describes.
func (m *Manager) putWithEvents(ctx context.Context, rec core.Sandbox, evs ...core.Event) error {
	_, err := m.deps.Store.PutSandboxEvents(ctx, rec, evs...)
	return err
}

// terminal reports whether an event ends a sandbox's event stream.
func terminal(typ string) bool { return typ == EventDestroyed || typ == EventFailed }

// Events returns every event of a sandbox so far.
func (m *Manager) Events(ctx context.Context, id string) ([]core.Event, error) {
	if _, err := m.deps.Store.GetSandbox(ctx, id); err != nil {
		return nil, err
	}
	return m.deps.Store.Events(ctx, id, 0)
}

// FollowEvents calls fn for each event of a sandbox, past and future, and
// returns after the sandbox's final event, when fn fails, or when ctx ends.
func (m *Manager) FollowEvents(ctx context.Context, id string, fn func(core.Event) error) error {
	rec, err := m.deps.Store.GetSandbox(ctx, id)
	if err != nil {
		return err
	}
	wake, unsubscribe := m.hub.subscribe(id)
	defer unsubscribe()
	var after int64
	ended := State(rec.State).Final()
	for {
		evs, err := m.deps.Store.Events(ctx, id, after)
		if err != nil {
			return err
		}
		for _, e := range evs {
			after = e.Seq
			if err := fn(e); err != nil {
				return err
			}
			if terminal(e.Type) {
				return nil
			}
		}
		if ended {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-m.life.Done():
			return nil
		case <-wake:
		}
	}
}
