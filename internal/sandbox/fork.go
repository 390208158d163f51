package sandbox

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"time"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/core"
)

// Fork.
//
// A fork is a snapshot of a running sandbox (snapshot.go, marked Fork)
// and N new sandboxes made from it at once. The parent keeps running (its
// processes are frozen only while its memory image is saved and its
// writable layer copied). Each copy is a sandbox of its own: its own ID,
// agent token, writable layer (what one writes, no other copy nor the
// parent sees), network namespace, veth (own MAC) and address, egress
// services, and deadline (the time the parent had left).
//
// Where the runtime copies memory (gVisor on a current runsc), the copies
// start from the parent's memory image: every process the parent ran
// runs on in each copy (memcopy.go says what each copy gets of its own,
// randomness included). Elsewhere (runc, an old runsc) the copies start
// their processes afresh on the parent's files, and inspect says so
// (the snapshot's kind: filesystem). The fork's snapshot goes once the
// last copy is gone.

// MaxForkCount bounds the copies of one fork.
const MaxForkCount = 16

// ForkRequest asks for copies of a running sandbox.
type ForkRequest struct {
	// Count is how many copies (1..MaxForkCount).
	Count int
	// Owner and Quota are as in CreateRequest: who the copies belong to
	// and what bounds their live sandboxes.
	Owner string
	Quota core.Quota
}

// Fork makes req.Count live copies of ready sandbox id (see above) and
// returns them with the snapshot they were made from. Either every copy is
// made or none is.
func (m *Manager) Fork(ctx context.Context, id string, req ForkRequest) ([]Sandbox, core.Snapshot, error) {
	if req.Count < 1 || req.Count > MaxForkCount {
		return nil, core.Snapshot{}, &FieldError{Field: "count", Err: fmt.Errorf("count %d is out of range [1, %d]: %w", req.Count, MaxForkCount, errdefs.ErrInvalidArgument)}
	}
	parent, err := m.liveEntry(ctx, id)
	if err != nil {
		return nil, core.Snapshot{}, err
	}
	snap, err := m.snapshot(ctx, id, "fork of "+id, true)
	if err != nil {
		return nil, core.Snapshot{}, err
	}
	// Until every copy stands on it (or failed), nothing may collect it.
	m.snaps.mu.Lock()
	if m.snaps.pins == nil {
		m.snaps.pins = map[string]int{}
	}
	m.snaps.pins[snap.ID]++
	m.snaps.mu.Unlock()
	defer func() {
		m.snaps.unpin(snap.ID)
		m.gcForkSnapshots(context.WithoutCancel(ctx))
	}()
	rec := parent.cur.Load().rec
	timeout := time.Until(rec.Deadline).Truncate(time.Second)
	if timeout < time.Second {
		timeout = 0 // the default
	}
	start := time.Now()
	out := make([]Sandbox, req.Count)
	errs := make([]error, req.Count)
	var wg sync.WaitGroup
	for i := range req.Count {
		wg.Go(func() {
			out[i], errs[i] = m.Create(ctx, CreateRequest{
				Snapshot: snap.ID, Timeout: timeout, Owner: req.Owner, Quota: req.Quota,
				Metadata: maps.Clone(rec.Metadata), Isolation: rec.Isolation, AllowSudo: new(rec.AllowSudo),
				OnTimeout: rec.OnTimeout, AutoResume: rec.AutoResume, IdlePause: rec.IdlePause,
			})
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for i, sb := range out {
			if errs[i] == nil {
				if derr := m.Destroy(context.WithoutCancel(ctx), sb.ID, "fork of "+id+" failed"); derr != nil {
					err = errors.Join(err, derr)
				}
			}
		}
		return nil, snap, fmt.Errorf("fork sandbox %s: %w", id, err)
	}
	ids := make([]string, len(out))
	for i, sb := range out {
		ids[i] = sb.ID
	}
	m.event(ctx, id, EventSnapshot, fmt.Sprintf("forked into %v from snapshot %s", ids, snap.ID))
	m.log.Info("sandbox_forked", "sandbox_id", id, "copies", len(out), "snapshot_id", snap.ID, "elapsed_ms", time.Since(start).Milliseconds())
	return out, snap, nil
}
