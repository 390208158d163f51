package sandbox

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/core"
)

// State is a sandbox's place in the lifecycle.
type State string

// States of the lifecycle state machine.
const (
	StateCreating State = "creating"
	StateReady    State = "ready"
	StatePaused   State = "paused"
	// StatePausing and StateResuming are on record while a pause or a
	// resume runs, so a restarted daemon knows what to finish or undo.
	StatePausing  State = "pausing"
	StateResuming State = "resuming"
	StateStopping State = "stopping"
	StateStopped  State = "stopped"
	StateFailed   State = "failed"
)

// Final reports whether nothing follows s.
func (s State) Final() bool { return s == StateStopped || s == StateFailed }

// next reports whether the lifecycle may move from s to to. It is the one
// place the state machine is written down.
func (s State) next(to State) bool {
	switch s {
	case StateCreating:
		return to == StateReady || to == StateFailed
	case StateReady:
		// Straight to stopped only when the deadline passed while the
		// daemon was down (adopt): there was nothing left to stop.
		return to == StatePausing || to == StateStopping || to == StateStopped || to == StateFailed
	case StatePaused:
		return to == StateResuming || to == StateStopping || to == StateStopped || to == StateFailed
	case StatePausing:
		// Back to ready when the pause failed before anything was lost.
		return to == StatePaused || to == StateReady || to == StateFailed
	case StateResuming:
		// Back to paused when the resume failed and was undone.
		return to == StateReady || to == StatePaused || to == StateFailed
	case StateStopping:
		return to == StateStopped || to == StateFailed
	}
	return false
}

// entry is the in-memory side of a live sandbox.
//
// Lifecycle operations (create, destroy, set timeout, set policy) hold op;
// whoever holds it owns rec, att and closed, and publishes what readers
// may see with publish. Readers never take op: they load cur.
type entry struct {
	// op is the operation lock: a one-slot semaphore rather than a
	// mutex, so a caller can stop waiting when its context ends.
	op chan struct{}
	// id is the sandbox's ID, fixed for the entry's life.
	id     string
	rec    core.Sandbox
	att    Attachment
	closed bool
	// lastIP is the address a paused sandbox had, asked for again when it
	// resumes (pause.go).
	lastIP netip.Addr
	// lastHost is the gateway (host side) it had then: a sandbox that
	// gets it again keeps the resolver and CA files it has.
	lastHost netip.Addr
	// act is its activity, for idle pause (idle.go).
	act activity

	// cur is the last published status; it is replaced, never changed.
	cur atomic.Pointer[status]
	// pub serializes publish (its ready-period handover, session.go).
	pub sync.Mutex
	// ooms is the OOM-kill count last seen by the monitor.
	ooms atomic.Int64
	// load is the memory load guardPageLoad follows, for the monitor's
	// account of a death while it goes on (loadFailure).
	load atomic.Pointer[guardedLoad]

	tmu   sync.Mutex // guards timer: Close stops it without op
	timer *time.Timer

	// abort cancels a create still in progress; set before the entry is
	// published and never changed.
	abort context.CancelFunc
}

// status is an immutable snapshot of a live sandbox for readers. Its
// record's maps are shared with the entry and never written after create.
type status struct {
	rec    core.Sandbox
	state  State
	att    Attachment
	closed bool
	// run is the ready period requests are bound to (session.go): set
	// while ready, and the same one for as long as it stays ready.
	run *running
}

func newEntry(rec core.Sandbox, abort context.CancelFunc) *entry {
	e := &entry{op: make(chan struct{}, 1), id: rec.ID, rec: rec, abort: abort}
	e.publish()
	return e
}

// state is the lifecycle state the op holder has reached.
func (e *entry) state() State { return State(e.rec.State) }

// moveTo changes the op holder's state, refusing a move the lifecycle
// does not allow. Readers see it at the next publish.
func (e *entry) moveTo(to State) error {
	if from := e.state(); !from.next(to) {
		return fmt.Errorf("sandbox %s is %s, cannot become %s: %w", e.rec.ID, from, to, errdefs.ErrFailedPrecondition)
	}
	e.rec.State = string(to)
	return nil
}

// publish makes the op holder's view what readers load. A sandbox that
// turns ready starts a ready period; one that stops being ready ends it,
// which ends every request bound to it (session.go).
func (e *entry) publish() {
	e.pub.Lock()
	defer e.pub.Unlock()
	st := &status{rec: e.rec, state: e.state(), att: e.att, closed: e.closed}
	prev := e.cur.Load()
	if st.state == StateReady && !st.closed {
		if prev != nil && prev.run != nil && prev.att == st.att {
			st.run = prev.run
		} else {
			st.run = newRunning()
		}
	}
	e.cur.Store(st)
	if prev != nil && prev.run != nil && prev.run != st.run {
		prev.run.cancel(st.endCause(e.id))
	}
}

// lock takes the operation lock, or gives up when ctx ends with an error
// of ctx's class (canceled, deadline exceeded).
func (e *entry) lock(ctx context.Context) error {
	select {
	case e.op <- struct{}{}:
		return nil
	default:
	}
	select {
	case e.op <- struct{}{}:
		return nil
	case <-ctx.Done():
		err := ctx.Err()
		if errors.Is(err, context.DeadlineExceeded) {
			err = errdefs.ErrDeadlineExceeded
		}
		return fmt.Errorf("sandbox %s is busy (%s): %w", e.id, e.cur.Load().state, err)
	}
}

// tryLock takes the operation lock if it is free.
func (e *entry) tryLock() bool {
	select {
	case e.op <- struct{}{}:
		return true
	default:
		return false
	}
}

func (e *entry) unlock() { <-e.op }

// stopTimer stops the deadline timer, if armed.
func (e *entry) stopTimer() {
	e.tmu.Lock()
	defer e.tmu.Unlock()
	if e.timer != nil {
		e.timer.Stop()
	}
}

// network is where a live sandbox sits on the host's network, or nil.
func (s *status) network() *NetworkInfo {
	if !s.att.SandboxIP.IsValid() {
		return nil
	}
	return &NetworkInfo{Address: s.att.SandboxIP, Gateway: s.att.HostIP, HostLink: s.att.HostIface}
}

// undo is a create's stack of compensations: each step that may leave
// something on the host pushes how to remove it before it runs (a step
// that fails half-way leaves half its work), and a failure unwinds the
// stack newest first.
type undo []undoStep

type undoStep struct {
	what string
	fn   func(ctx context.Context) error
}

func (u *undo) push(what string, fn func(ctx context.Context) error) {
	*u = append(*u, undoStep{what, fn})
}

// unwind runs every compensation, newest first, under its own time budget
// (the create's context may be what ended), and empties the stack.
func (u *undo) unwind(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 60*time.Second)
	defer cancel()
	var errs []error
	for i := len(*u) - 1; i >= 0; i-- {
		s := (*u)[i]
		if err := s.fn(ctx); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", s.what, err))
		}
	}
	*u = nil
	return errors.Join(errs...)
}
