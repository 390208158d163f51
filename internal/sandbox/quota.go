package sandbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/core"
	"github.com/berth-sandbox/berth/internal/quota"
)

// A key's quota bounds what its sandboxes hold. max-sandboxes counts every
// live one, paused ones too: each holds a record, a writable layer on the
// host's disk and a uid range, and a key whose parked sandboxes were not
// counted could fill the disk by creating and pausing in turn. max-cpu and
// max-memory count running ones only: a paused sandbox holds no CPU,
// memory or process on the host (pause.go), so a key may park more than
// it may run. A resume is admitted against those two as a create is,
// with the owner's quota as the key store has it then, and refused the
// same way (resource_exhausted, the sandbox stays paused). A sandbox that
// is pausing still holds what it ran with and counts until it is paused;
// one that is resuming counts from its admission on.

// KeyQuotas is where the Manager reads a sandbox owner's quota when it
// resumes: the store of API keys. A key it does not know bounds nothing.
type KeyQuotas interface {
	GetAPIKey(ctx context.Context, id string) (core.APIKey, error)
}

// checkQuotaTimeout refuses a lifetime above the owner's max-timeout before
// anything is made.
func checkQuotaTimeout(q core.Quota, d time.Duration) error {
	if err := quota.Timeout(q, d); err != nil {
		return &FieldError{Field: "timeout", Err: err}
	}
	return nil
}

// admitLocked checks a new or resuming sandbox of owner asking for l
// against its quota, counting every other live sandbox of the same owner
// (those still being created too) and, for CPU and memory, only those
// that run (m.waking: admitted resumes count as running); self, when not
// empty, is the resuming sandbox, which holds its place among the live
// ones already and is checked against the CPU and memory bounds only. It
// runs under m.mu in the same critical section that adds the new entry or
// marks the resume, so concurrent creates and resumes cannot both take
// the last of a bound.
func (m *Manager) admitLocked(owner string, q core.Quota, l Limits, self string) error {
	if self != "" {
		q.MaxSandboxes = 0
	}
	if q == (core.Quota{}) {
		return nil
	}
	var used quota.Usage
	for id, e := range m.live {
		st := e.cur.Load()
		if id == self || st == nil || st.rec.Owner != owner {
			continue
		}
		if _, waking := m.waking[id]; st.state == StatePaused && !waking {
			used.Sandboxes++
			continue
		}
		used.Add(st.rec.CPUMillis, st.rec.MemoryBytes)
	}
	return quota.Admit(q, used, l.CPUMillis, l.MemoryBytes)
}

// admitResume checks that paused sandbox e may run again within its
// owner's quota and, if so, counts it as running until done is called
// (once its published state is no longer paused, or it is paused again).
func (m *Manager) admitResume(ctx context.Context, e *entry) (done func(), err error) {
	q, err := m.ownerQuota(ctx, e.rec.Owner)
	if err != nil {
		return nil, fmt.Errorf("resume sandbox %s: %w", e.id, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.admitLocked(e.rec.Owner, q, Limits{CPUMillis: e.rec.CPUMillis, MemoryBytes: e.rec.MemoryBytes}, e.id); err != nil {
		return nil, fmt.Errorf("resume sandbox %s: key %s: %w", e.id, e.rec.Owner, err)
	}
	m.waking[e.id] = struct{}{}
	return func() {
		m.mu.Lock()
		delete(m.waking, e.id)
		m.mu.Unlock()
	}, nil
}

// ownerQuota is the quota of the API key owner as the key store has it
// now: none for the operator's sandboxes (owner ""), without a key store,
// or for a key the store does not know.
func (m *Manager) ownerQuota(ctx context.Context, owner string) (core.Quota, error) {
	if owner == "" || m.deps.Keys == nil {
		return core.Quota{}, nil
	}
	k, err := m.deps.Keys.GetAPIKey(ctx, owner)
	if errors.Is(err, errdefs.ErrNotFound) {
		return core.Quota{}, nil
	}
	if err != nil {
		return core.Quota{}, fmt.Errorf("quota of key %s: %w", owner, err)
	}
	return k.Quota, nil
}
