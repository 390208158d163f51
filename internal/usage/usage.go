// Package usage meters what sandboxes use and attributes it to their API
// keys: CPU time (the cgroup's own accounting), memory integrated over
// time and its peak, disk in use, egress bytes and running time. It is fed
// the sandbox Manager's monitor samples, keeps running totals in memory,
// writes them to the store every few seconds and when a sandbox ends, and
// picks a re-adopted sandbox's totals up from the store after a daemon
// restart. Records outlive their sandboxes.
package usage

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/core"
	"github.com/berth-sandbox/berth/internal/sandbox"
)

// Store keeps usage records.
type Store interface {
	GetUsage(ctx context.Context, id string) (core.Usage, error)
	PutUsage(ctx context.Context, u core.Usage) error
	ListUsage(ctx context.Context, since time.Time) ([]core.Usage, error)
}

// Meter accumulates samples into usage records.
type Meter struct {
	store Store
	log   *slog.Logger

	mu  sync.Mutex
	acc map[string]*account
}

type account struct {
	u     core.Usage
	lastT time.Time
	// egressBase is the egress counted before this daemon's run: the
	// proxy's counters start at zero with the daemon.
	egressBase int64
	dirty      bool
}

// New returns a Meter writing to st.
func New(st Store, log *slog.Logger) *Meter {
	if log == nil {
		log = slog.Default()
	}
	return &Meter{store: st, log: log, acc: map[string]*account{}}
}

// Observe adds one sample; a final one is written at once.
func (m *Meter) Observe(s sandbox.UsageSample) {
	m.mu.Lock()
	a := m.acc[s.ID]
	m.mu.Unlock()
	if a == nil {
		a = m.open(s)
	}
	m.mu.Lock()
	if cur := m.acc[s.ID]; cur != nil {
		a = cur
	} else {
		m.acc[s.ID] = a
	}
	u := &a.u
	if !a.lastT.IsZero() && s.Time.After(a.lastT) {
		dt := s.Time.Sub(a.lastT).Seconds()
		u.Seconds += dt
		u.MemoryByteSeconds += float64(s.Stats.MemoryBytes) * dt
	}
	a.lastT = s.Time
	u.CPU = max(u.CPU, s.Stats.CPUUsage)
	u.MemoryPeakBytes = max(u.MemoryPeakBytes, s.Stats.MemoryMax, s.Stats.MemoryBytes)
	u.DiskBytes = s.Stats.DiskUsedBytes
	u.EgressBytes = max(u.EgressBytes, a.egressBase+s.EgressBytes)
	u.UpdatedAt = s.Time.UTC()
	a.dirty = true
	rec := *u
	if s.Final {
		delete(m.acc, s.ID)
	}
	m.mu.Unlock()
	if s.Final {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := m.store.PutUsage(ctx, rec); err != nil {
			m.log.Warn("usage_write_failed", "sandbox_id", s.ID, "err", err)
		}
	}
}

// open starts an account: from the store for a sandbox metered before (a
// re-adopted one), else empty.
func (m *Meter) open(s sandbox.UsageSample) *account {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	u, err := m.store.GetUsage(ctx, s.ID)
	if err == nil {
		return &account{u: u, egressBase: u.EgressBytes}
	}
	if !errors.Is(err, errdefs.ErrNotFound) {
		m.log.Warn("usage_read_failed", "sandbox_id", s.ID, "err", err)
	}
	return &account{u: core.Usage{SandboxID: s.ID, Owner: s.Owner, StartedAt: s.Time.UTC()}}
}

// Flush writes every record changed since the last flush.
func (m *Meter) Flush(ctx context.Context) {
	m.mu.Lock()
	var recs []core.Usage
	for _, a := range m.acc {
		if a.dirty {
			recs = append(recs, a.u)
			a.dirty = false
		}
	}
	m.mu.Unlock()
	for _, u := range recs {
		if err := m.store.PutUsage(ctx, u); err != nil {
			m.log.Warn("usage_write_failed", "sandbox_id", u.SandboxID, "err", err)
		}
	}
}

// Run flushes every interval until ctx ends, then once more.
func (m *Meter) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			m.Flush(context.WithoutCancel(ctx))
			return
		case <-t.C:
			m.Flush(ctx)
		}
	}
}

// List returns every sandbox's usage metered at or after since, the
// running totals of live sandboxes included.
func (m *Meter) List(ctx context.Context, since time.Time) ([]core.Usage, error) {
	stored, err := m.store.ListUsage(ctx, since)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	live := make(map[string]core.Usage, len(m.acc))
	for id, a := range m.acc {
		live[id] = a.u
	}
	m.mu.Unlock()
	out := stored[:0:0]
	for _, u := range stored {
		if l, ok := live[u.SandboxID]; ok {
			u = l
			delete(live, u.SandboxID)
		}
		out = append(out, u)
	}
	for _, u := range live {
		if !u.UpdatedAt.Before(since) {
			out = append(out, u)
		}
	}
	slices.SortFunc(out, func(a, b core.Usage) int { return a.StartedAt.Compare(b.StartedAt) })
	return out, nil
}

// Total is usage summed over sandboxes.
type Total struct {
	Owner             string
	Sandboxes         int
	CPU               time.Duration
	MemoryByteSeconds float64
	MemoryPeakBytes   int64
	DiskBytes         int64
	EgressBytes       int64
	Seconds           float64
}

// ByOwner sums usage per owner (API key ID), in first-seen order. Peak
// memory is the largest one sandbox reached.
func ByOwner(us []core.Usage) []Total {
	idx := map[string]int{}
	var out []Total
	for _, u := range us {
		i, ok := idx[u.Owner]
		if !ok {
			i = len(out)
			idx[u.Owner] = i
			out = append(out, Total{Owner: u.Owner})
		}
		t := &out[i]
		t.Sandboxes++
		t.CPU += u.CPU
		t.MemoryByteSeconds += u.MemoryByteSeconds
		t.MemoryPeakBytes = max(t.MemoryPeakBytes, u.MemoryPeakBytes)
		t.DiskBytes += u.DiskBytes
		t.EgressBytes += u.EgressBytes
		t.Seconds += u.Seconds
	}
	return out
}
