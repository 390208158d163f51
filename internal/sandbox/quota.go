package sandbox

import (
	"fmt"
	"time"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/core"
)

// checkQuotaTimeout refuses a lifetime above the owner's max-timeout before
// anything is made.
func checkQuotaTimeout(q core.Quota, d time.Duration) error {
	if q.MaxTimeout > 0 && d > q.MaxTimeout {
		return &FieldError{Field: "timeout", Err: fmt.Errorf("quota max-timeout %s exceeded: the sandbox asks for %s: %w", q.MaxTimeout, d, errdefs.ErrResourceExhausted)}
	}
	return nil
}

// admitLocked checks a new sandbox of owner against its quota, counting
// every live sandbox of the same owner (those still being created too). It
// runs under m.mu in the same critical section that adds the new entry, so
// concurrent creates cannot both take the last slot.
func (m *Manager) admitLocked(owner string, q core.Quota, l Limits) error {
	if q == (core.Quota{}) {
		return nil
	}
	var n, cpu, mem int64
	for _, e := range m.live {
		st := e.cur.Load()
		if st == nil || st.rec.Owner != owner {
			continue
		}
		n++
		cpu += st.rec.CPUMillis
		mem += st.rec.MemoryBytes
	}
	switch {
	case q.MaxSandboxes > 0 && n+1 > q.MaxSandboxes:
		return fmt.Errorf("quota max-sandboxes %d reached: %d sandboxes in use: %w", q.MaxSandboxes, n, errdefs.ErrResourceExhausted)
	case q.MaxCPUMillis > 0 && cpu+l.CPUMillis > q.MaxCPUMillis:
		return fmt.Errorf("quota max-cpu %g exceeded: %g cores in use, the sandbox asks for %g: %w",
			float64(q.MaxCPUMillis)/1000, float64(cpu)/1000, float64(l.CPUMillis)/1000, errdefs.ErrResourceExhausted)
	case q.MaxMemoryBytes > 0 && mem+l.MemoryBytes > q.MaxMemoryBytes:
		return fmt.Errorf("quota max-memory %s exceeded: %s in use, the sandbox asks for %s: %w",
			fmtBytes(q.MaxMemoryBytes), fmtBytes(mem), fmtBytes(l.MemoryBytes), errdefs.ErrResourceExhausted)
	}
	return nil
}
