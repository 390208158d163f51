// Package quota checks what an API key's sandboxes ask for against the
// key's quota (core.Quota), for the daemon's Manager and the Kubernetes
// gateway alike, so both refuse with the same words.
package quota

import (
	"fmt"
	"time"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/core"
	"github.com/berth-sandbox/berth/internal/units"
)

// Usage is what a key's live sandboxes hold together.
type Usage struct {
	Sandboxes, CPUMillis, MemoryBytes int64
}

// Add counts one more sandbox of cpuMillis and memoryBytes.
func (u *Usage) Add(cpuMillis, memoryBytes int64) {
	u.Sandboxes++
	u.CPUMillis += cpuMillis
	u.MemoryBytes += memoryBytes
}

// Admit refuses (errdefs.ErrResourceExhausted) a new sandbox of cpuMillis
// and memoryBytes beside what used holds, when q bounds it; zero fields of
// q are unbounded.
func Admit(q core.Quota, used Usage, cpuMillis, memoryBytes int64) error {
	switch {
	case q.MaxSandboxes > 0 && used.Sandboxes+1 > q.MaxSandboxes:
		return fmt.Errorf("quota max-sandboxes %d reached: %d sandboxes in use: %w", q.MaxSandboxes, used.Sandboxes, errdefs.ErrResourceExhausted)
	case q.MaxCPUMillis > 0 && used.CPUMillis+cpuMillis > q.MaxCPUMillis:
		return fmt.Errorf("quota max-cpu %g exceeded: %g cores in use, the sandbox asks for %g: %w",
			float64(q.MaxCPUMillis)/1000, float64(used.CPUMillis)/1000, float64(cpuMillis)/1000, errdefs.ErrResourceExhausted)
	case q.MaxMemoryBytes > 0 && used.MemoryBytes+memoryBytes > q.MaxMemoryBytes:
		return fmt.Errorf("quota max-memory %s exceeded: %s in use, the sandbox asks for %s: %w",
			units.FormatSize(q.MaxMemoryBytes), units.FormatSize(used.MemoryBytes), units.FormatSize(memoryBytes), errdefs.ErrResourceExhausted)
	}
	return nil
}

// Timeout refuses (errdefs.ErrResourceExhausted) a lifetime d above q's
// max-timeout. The error is about the request's timeout field.
func Timeout(q core.Quota, d time.Duration) error {
	if q.MaxTimeout > 0 && d > q.MaxTimeout {
		return fmt.Errorf("quota max-timeout %s exceeded: the sandbox asks for %s: %w", q.MaxTimeout, d, errdefs.ErrResourceExhausted)
	}
	return nil
}
