package agent

import (
	"context"
	"os"
	"os/signal"
	"sync"

	"golang.org/x/sys/unix"
)

// exitStatus is how a process ended, as wait4 reported it.
type exitStatus struct {
	ws  unix.WaitStatus
	err error // set when waiting itself failed
}

// Reaper collects the exit status of every child of the agent. As PID 1 the
// agent inherits every orphan of the sandbox, so one loop calls
// wait4(-1, WNOHANG) on each SIGCHLD and hands statuses to whoever registered
// the pid; statuses nobody registered (orphans) are just dropped, which is
// what reaping them means. Using exec.Cmd.Wait next to such a loop would race
// with it for the status, so processes the agent starts are only ever waited
// for here.
//
// Start must be called with the reaper's lock held from fork to registration
// (see forkLocked): otherwise a child that exits at once could be reaped before
// anyone registered it, and its status would be lost.
type Reaper struct {
	mu      sync.Mutex
	waiters map[int]chan exitStatus
	wake    chan os.Signal
	done    chan struct{}
	stop    context.CancelFunc
}

// NewReaper starts the reaping loop. Call it once per process, and only in a
// process that should reap all its children (PID 1 or a child subreaper);
// stop it with Close.
func NewReaper() *Reaper {
	ctx, cancel := context.WithCancel(context.Background())
	r := &Reaper{
		waiters: make(map[int]chan exitStatus),
		wake:    make(chan os.Signal, 1),
		done:    make(chan struct{}),
		stop:    cancel,
	}
	signal.Notify(r.wake, unix.SIGCHLD)
	go r.loop(ctx)
	return r
}

// Close stops the loop; children that exit later stay zombies.
func (r *Reaper) Close() {
	r.stop()
	<-r.done
	signal.Stop(r.wake)
}

func (r *Reaper) loop(ctx context.Context) {
	defer close(r.done)
	for {
		r.reapAll()
		select {
		case <-ctx.Done():
			return
		case <-r.wake:
		}
	}
}

func (r *Reaper) reapAll() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil || pid <= 0 {
			return
		}
		if ws.Stopped() || ws.Continued() {
			continue
		}
		if ch, ok := r.waiters[pid]; ok {
			delete(r.waiters, pid)
			ch <- exitStatus{ws: ws}
		}
	}
}

// forkLocked runs start (which forks one child and returns its pid) under the
// reaper lock and registers the pid before any status can be collected.
func (r *Reaper) forkLocked(start func() (int, error)) (int, <-chan exitStatus, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	pid, err := start()
	if err != nil {
		return 0, nil, err
	}
	ch := make(chan exitStatus, 1)
	r.waiters[pid] = ch
	// The SIGCHLD for a fast child may have arrived before we registered it;
	// poke the loop so it looks again.
	select {
	case r.wake <- unix.SIGCHLD:
	default:
	}
	return pid, ch, nil
}

// spawner starts children and delivers their statuses: through the shared
// Reaper when the agent reaps everything, or by waiting for the one pid when
// it runs as an ordinary process (tests), so it never steals statuses of
// children that are not its own.
type spawner struct{ reaper *Reaper }

func (s spawner) spawn(start func() (int, error)) (int, <-chan exitStatus, error) {
	if s.reaper != nil {
		return s.reaper.forkLocked(start)
	}
	pid, err := start()
	if err != nil {
		return 0, nil, err
	}
	ch := make(chan exitStatus, 1)
	go func() {
		for {
			var ws unix.WaitStatus
			_, err := unix.Wait4(pid, &ws, 0, nil)
			if err == unix.EINTR {
				continue
			}
			if err == nil && (ws.Stopped() || ws.Continued()) {
				continue
			}
			ch <- exitStatus{ws: ws, err: err}
			return
		}
	}()
	return pid, ch, nil
}
