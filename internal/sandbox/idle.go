package sandbox

import (
	"context"
	"sync/atomic"
	"time"
)

// Idle pause: a sandbox created with IdlePause is paused once it has had
// no request (API or data plane, through Agent), no request in flight (an
// attached stream: the request's context has not ended) and used under
// 1 % of a core, all for that long.

// activity is what idle pause watches of one live sandbox.
type activity struct {
	// last is when it was last active (unix nanoseconds).
	last atomic.Int64
	// open counts requests in flight.
	open atomic.Int32
	// cpu and cpuAt are the CPU time at the previous monitor sample and
	// when it was taken; only the monitor touches them.
	cpu   time.Duration
	cpuAt time.Time
}

func (a *activity) touch() { a.last.Store(time.Now().UnixNano()) }

// idleFor is how long the sandbox has been idle.
func (a *activity) idleFor() time.Duration {
	if a.open.Load() > 0 {
		return 0
	}
	return time.Since(time.Unix(0, a.last.Load()))
}

// trackRequest counts a request as activity until ctx ends.
func (a *activity) trackRequest(ctx context.Context) {
	a.open.Add(1)
	a.touch()
	context.AfterFunc(ctx, func() {
		a.touch()
		a.open.Add(-1)
	})
}

// sampleIdle takes the monitor's CPU sample of a ready sandbox and pauses
// it, in the background, once it has been idle for its IdlePause.
func (m *Manager) sampleIdle(e *entry, cpu time.Duration) {
	idle := e.cur.Load().rec.IdlePause
	if idle <= 0 {
		return
	}
	a := &e.act
	now := time.Now()
	if !a.cpuAt.IsZero() {
		// 1 % of a core over the interval counts as busy.
		if dt := now.Sub(a.cpuAt); dt > 0 && (cpu-a.cpu)*100 >= dt {
			a.touch()
		}
	}
	a.cpu, a.cpuAt = cpu, now
	if a.idleFor() < idle || !m.track() {
		return
	}
	go func() {
		defer m.wg.Done()
		m.pauseIdle(e)
	}()
}

// pauseIdle pauses a sandbox that is still ready and idle once no other
// operation runs.
func (m *Manager) pauseIdle(e *entry) {
	if err := e.lock(m.life); err != nil {
		return
	}
	defer e.unlock()
	idle := e.rec.IdlePause
	if e.closed || e.state() != StateReady || e.act.idleFor() < idle {
		return
	}
	remaining := max(time.Until(e.rec.Deadline), 0)
	if err := m.pause(m.life, e, remaining, "idle for "+idle.String(), false); err != nil && !e.closed {
		m.log.Warn("idle_pause", "sandbox_id", e.id, "err", err)
		if e.state() == StateReady {
			// It runs on: tried again once idle for as long again,
			// not at every sample.
			e.act.touch()
			m.event(m.life, e.id, EventPauseFailed, "idle for "+idle.String()+": "+err.Error())
		}
	}
}
