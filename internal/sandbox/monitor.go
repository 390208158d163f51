package sandbox

import (
	"context"
	"fmt"
	"time"

	"github.com/berth-sandbox/berth/internal/runtime"
)

// monitor samples every live sandbox: an OOM kill inside becomes an event,
// and a sandbox whose init died is torn down with a reason.
func (m *Manager) monitor() {
	t := time.NewTicker(m.cfg.MonitorInterval)
	defer t.Stop()
	for {
		select {
		case <-m.life.Done():
			return
		case <-t.C:
		}
		m.mu.Lock()
		entries := make([]*entry, 0, len(m.live))
		for _, e := range m.live {
			entries = append(entries, e)
		}
		m.mu.Unlock()
		for _, e := range entries {
			m.check(m.life, e)
		}
	}
}

func (m *Manager) check(ctx context.Context, e *entry) {
	// A sandbox busy with a lifecycle operation (a long workspace setup,
	// a destroy) is sampled next time; the monitor never waits on one.
	if !e.op.TryLock() {
		return
	}
	if e.closed || e.rec.State != StateReady {
		e.op.Unlock()
		return
	}
	id := e.rec.ID
	e.op.Unlock()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	st, err := m.deps.Runtime.Inspect(ctx, id)
	if err == nil && st.Status != runtime.StatusRunning && st.Status != runtime.StatusPaused {
		if ctx.Err() != nil {
			return
		}
		m.destroy(ctx, e, fmt.Sprintf("sandbox init exited (runtime status %s)", st.Status))
		return
	}
	sr, ok := m.deps.Runtime.(StatsReader)
	if !ok {
		return
	}
	stats, err := sr.Stats(ctx, id)
	if err != nil {
		return
	}
	e.op.Lock()
	prev := e.ooms
	e.ooms = stats.OOMKills
	e.op.Unlock()
	if stats.OOMKills > prev {
		m.event(ctx, id, EventOOM, fmt.Sprintf("out of memory: %d process(es) killed inside the sandbox (limit %d bytes)", stats.OOMKills-prev, stats.MemoryLimit))
	}
}
