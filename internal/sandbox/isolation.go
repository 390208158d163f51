package sandbox

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/core"
	"github.com/berth-sandbox/berth/internal/runtime"
)

// Isolation levels are runtimes: the daemon wires one Runtime per level it
// offers (Deps.Runtimes), and every runtime call for a sandbox goes to the
// runtime of the level recorded in its record. A level Berth knows but the
// daemon cannot offer (no runsc on the host) is refused at create with the
// daemon's reason (Config.Unavailable); nothing falls back to another
// level.

// runtimes builds the level → Runtime table from deps: Runtime is the runc
// level unless Runtimes names one.
func runtimes(deps Deps) map[string]Runtime {
	rts := map[string]Runtime{}
	for k, v := range deps.Runtimes {
		if v != nil {
			rts[k] = v
		}
	}
	if _, ok := rts[core.IsolationRunc]; !ok && deps.Runtime != nil {
		rts[core.IsolationRunc] = deps.Runtime
	}
	return rts
}

// isolationOf is the level of a record; records from before levels
// existed ran under runc.
func isolationOf(rec core.Sandbox) string {
	if rec.Isolation == "" {
		return core.IsolationRunc
	}
	return rec.Isolation
}

// resolveIsolation settles a create's level: the request's, else the
// template's default, else the daemon's. Unknown levels are invalid; a
// known level this daemon has no runtime for is a failed precondition
// carrying the daemon's reason (what to install).
func (m *Manager) resolveIsolation(requested, template string) (string, error) {
	iso, from := requested, "isolation"
	if iso == "" && template != "" {
		iso, from = template, "the template's default isolation"
	}
	if iso == "" {
		iso, from = m.cfg.DefaultIsolation, "the daemon's default isolation"
	}
	if !slices.Contains(core.Isolations(), iso) {
		return "", &FieldError{Field: "isolation", Err: fmt.Errorf("%s %q: want one of %s: %w", from, iso, strings.Join(core.Isolations(), ", "), errdefs.ErrInvalidArgument)}
	}
	if _, ok := m.rts[iso]; !ok {
		why := m.cfg.Unavailable[iso]
		if why == "" {
			why = "this daemon has no runtime for it"
		}
		return "", &FieldError{Field: "isolation", Err: fmt.Errorf("isolation %s (%s) is not available: %s: %w", iso, from, why, errdefs.ErrFailedPrecondition)}
	}
	return iso, nil
}

// runtimeOf is the runtime a sandbox runs under. A record of a level this
// daemon no longer offers (runsc removed since it was made) gets a runtime
// that refuses everything, so the sandbox is failed with that reason
// instead of being handed to another level's runtime.
func (m *Manager) runtimeOf(rec core.Sandbox) Runtime {
	iso := isolationOf(rec)
	if rt, ok := m.rts[iso]; ok {
		return rt
	}
	return missingRuntime{iso: iso, why: m.cfg.Unavailable[iso]}
}

// missingRuntime stands in for a level the daemon has no runtime for.
type missingRuntime struct{ iso, why string }

func (r missingRuntime) err(id string) error {
	why := r.why
	if why == "" {
		why = "this daemon has no runtime for it"
	}
	return fmt.Errorf("sandbox %s: isolation %s is not available: %s: %w", id, r.iso, why, errdefs.ErrFailedPrecondition)
}

func (r missingRuntime) Create(_ context.Context, spec runtime.Spec) error { return r.err(spec.ID) }
func (r missingRuntime) Destroy(_ context.Context, id string) error        { return r.err(id) }
func (r missingRuntime) Inspect(_ context.Context, id string) (runtime.State, error) {
	return runtime.State{}, r.err(id)
}
func (r missingRuntime) List(context.Context) ([]string, error) { return nil, nil }

// runtimeVersion is what a sandbox of level iso records as its runtime.
func (m *Manager) runtimeVersion(iso string) string { return m.cfg.RuntimeVersions[iso] }

// taskBytes is the memory a sandbox's limit must hold per task of its
// pids limit (fitPids), by isolation level.
var taskBytes = map[string]int64{
	core.IsolationGVisor: 2 << 20,
	core.IsolationRunc:   256 << 10,
}

// fitPids keeps a sandbox's pids limit within what its memory limit
// holds, so a fork bomb meets the pids limit well before the memory
// limit.
//
// Under gVisor each task costs host memory charged to that limit: the
// sentry's record of it and, on systrap, a stub process per address
// space. Measured with a fork bomb held at the pids limit (the agent
// kills it there, internal/agent/pids.go): peaks of 147 MiB at 256 tasks,
// 306 to 482 MiB at 512 (the count overshoots the limit by up to a fifth
// before the kill lands), 639 MiB at 1,024. A bomb that meets its pids
// limit first is killed and the sandbox goes on; one that meets the
// memory limit first takes the whole sandbox down, since the host's OOM
// killer sees the sentry. So: one task per 2 MiB.
//
// Under runc a shell's task costs the sandbox's memory about 100 KiB
// (kernel stack, page tables, the shell's own pages; a busybox bomb at
// 1,020 tasks held 92 MiB, at 462 tasks 48 MiB). A bomb in a sandbox
// whose memory cannot hold its pids limit never meets that limit: it
// fills the memory with tasks, which then thrash the page cache (the
// shell's own text, read back from disk again and again) without an OOM
// kill, hundreds of them runnable at once; the sandbox's agent and the
// exec that started the bomb starve, a kill takes a minute, and the disk
// traffic reaches the host. Seen in 64 MiB with the default 1,024. So:
// one task per 256 KiB (64 MiB: 256 tasks), which leaves the workload
// more than half the memory beside a bomb.
//
// A limit that came from a default is lowered to the ceiling (under
// gVisor 512 MiB gives 256 tasks; under runc the default 1,024 fits from
// 256 MiB up), and one the request asked for (asked) is refused, naming
// both fields.
func fitPids(l *Limits, iso string, asked bool) error {
	per := taskBytes[iso]
	if per == 0 {
		return nil
	}
	ceiling := max(l.MemoryBytes/per, MinLimits.PidsLimit)
	if l.PidsLimit <= ceiling {
		return nil
	}
	if !asked {
		l.PidsLimit = ceiling
		return nil
	}
	return &FieldError{Field: "pids", Err: fmt.Errorf("pids %d is more than a %s sandbox with memory %s holds: each of its tasks takes memory from that limit, so at most %d (one per %s); lower pids or raise memory: %w",
		l.PidsLimit, iso, fmtLimit("memory", l.MemoryBytes), ceiling, fmtBytes(per), errdefs.ErrInvalidArgument)}
}
