package sandbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/core"
	"github.com/berth-sandbox/berth/internal/runtime"
)

// monitorParallel bounds how many sandboxes one monitor round samples at
// once: each sample is a runtime state query and a cgroup read, so a
// round over many sandboxes takes about the slowest few, not their sum,
// without starting one process per sandbox at once.
const monitorParallel = 8

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
		m.sample(m.life)
	}
}

// sample checks every live sandbox once, monitorParallel at a time, and
// returns when all are checked.
func (m *Manager) sample(ctx context.Context) {
	m.mu.Lock()
	entries := make([]*entry, 0, len(m.live))
	for _, e := range m.live {
		entries = append(entries, e)
	}
	m.mu.Unlock()
	var g errgroup.Group
	g.SetLimit(monitorParallel)
	for _, e := range entries {
		g.Go(func() error {
			m.check(ctx, e)
			return nil
		})
	}
	_ = g.Wait() // the samplers return nil: each logs its own failures
}

func (m *Manager) check(ctx context.Context, e *entry) {
	// Only ready sandboxes are sampled, from their published status: the
	// monitor never waits on a lifecycle operation (a long workspace
	// setup, a destroy).
	if st := e.cur.Load(); st.closed || st.state != StateReady {
		return
	}
	id := e.id
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	rt := m.runtimeOf(e.cur.Load().rec)
	st, err := rt.Inspect(ctx, id)
	if err == nil && st.Status != runtime.StatusRunning && st.Status != runtime.StatusPaused {
		if ctx.Err() != nil {
			return
		}
		// Only if it is still ready and still not running once no
		// lifecycle operation runs: a pause stops the runtime on purpose.
		exited := func() bool {
			if e.state() != StateReady {
				return false
			}
			now, err := rt.Inspect(ctx, id)
			return err == nil && now.Status != runtime.StatusRunning && now.Status != runtime.StatusPaused
		}
		// Not found: something else (a kill through the API) ended it
		// meanwhile, which is what the monitor was about to do.
		if err := m.destroyIf(ctx, e, m.exitReason(ctx, e, rt, st.Status), exited); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			m.log.Warn("destroy_exited_failed", "sandbox_id", e.id, "err", err)
		}
		return
	}
	sr, ok := rt.(StatsReader)
	if !ok {
		return
	}
	stats, err := sr.Stats(ctx, id)
	if err != nil {
		return
	}
	m.sampleIdle(e, stats.CPUUsage)
	m.meter(e, stats, false)
	if prev := e.ooms.Swap(stats.OOMKills); stats.OOMKills > prev {
		m.event(ctx, id, EventOOM, fmt.Sprintf("out of memory: %d process(es) killed inside the sandbox (limit %d bytes)", stats.OOMKills-prev, stats.MemoryLimit))
	}
}

// exitReason says why a ready sandbox's init is gone: a memory load that
// failed meanwhile (loadFailure) comes first. Under gVisor the
// host's OOM killer sees one process, the sentry, holding all the
// sandbox's memory, so an out-of-memory gVisor sandbox dies whole; its
// cgroup's OOM count, still readable until teardown, tells that apart from
// any other death, and the reason and an oom event say so.
func (m *Manager) exitReason(ctx context.Context, e *entry, rt Runtime, status runtime.Status) string {
	reason := fmt.Sprintf("sandbox init exited (runtime status %s)", status)
	if report := crashReport(rt, e.id); report != "" {
		reason += ": " + report
	}
	if lf := m.loadFailure(ctx, e); lf != "" {
		reason = lf + "; " + reason
	}
	sr, ok := rt.(StatsReader)
	if !ok {
		return reason
	}
	stats, err := sr.Stats(ctx, e.id)
	if err != nil {
		return reason
	}
	prev := e.ooms.Swap(stats.OOMKills)
	fresh := stats.OOMKills > prev
	// Under gVisor the processes in the sandbox's cgroup are the sentry,
	// its gofer and the platform's stubs, and on ptrace or kvm the
	// sandbox cannot outlive a kill of any of them (on systrap a killed
	// stub may take just its guest process, but the sentry is as likely
	// the victim, as seen). The sandbox is gone here, so an OOM kill
	// ended it, also one the monitor's sampling already counted (and
	// reported) while the dying sentry still looked running.
	fatal := e.cur.Load().rec.Isolation == core.IsolationGVisor && stats.OOMKills > 0
	if !fresh && !fatal {
		return reason
	}
	reason = fmt.Sprintf("out of memory: the sandbox was killed at its memory limit (%s); %s", fmtBytes(stats.MemoryLimit), reason)
	if fresh {
		m.event(ctx, e.id, EventOOM, reason)
	}
	return reason
}

// crashReport is the runtime's account of why sandbox id's init died on
// its own (CrashReporter), or "".
func crashReport(rt Runtime, id string) string {
	if cr, ok := rt.(CrashReporter); ok {
		return cr.CrashReport(id)
	}
	return ""
}

// meter hands a sample to the usage sink.
func (m *Manager) meter(e *entry, stats runtime.Stats, final bool) {
	if m.deps.Usage == nil {
		return
	}
	s := UsageSample{ID: e.id, Owner: e.cur.Load().rec.Owner, Time: time.Now(), Stats: stats, Final: final}
	if m.deps.Meter != nil {
		if u, ok := m.deps.Meter.DaemonUsage(e.id); ok {
			s.EgressBytes = u.BytesOut + u.BytesIn
		}
	}
	m.deps.Usage.Observe(s)
}

// meterFinal takes a last sample before a sandbox's cgroup goes, so the
// CPU it used since the monitor's last round is not lost.
func (m *Manager) meterFinal(ctx context.Context, e *entry) {
	if m.deps.Usage == nil {
		return
	}
	sr, ok := m.deps.Runtime.(StatsReader)
	if !ok {
		return
	}
	stats, err := sr.Stats(ctx, e.id)
	if err != nil {
		// Nothing left to read (a failed create); the monitor's samples
		// stand.
		return
	}
	m.meter(e, stats, true)
}
