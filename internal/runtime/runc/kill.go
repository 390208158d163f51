package runc

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Kill always wins: a sandbox's processes may fork as fast as they are
// killed (a fork bomb refills its pids limit from whatever was born after
// the kill list was read), may be frozen (a paused sandbox ignores SIGKILL
// until thawed), or may sit in uninterruptible sleep. Each round stops new
// forks first, then kills everything, then lets the signals land:
//
//   - cgroup v2 (also the unified hierarchy of a hybrid host, where runc
//     places every sandbox too): cgroup.kill (5.14+) kills the whole
//     subtree and fails forks into it while it runs.
//   - cgroup v1: the freezer stops every task where it stands (a task
//     cannot fork while frozen), SIGKILL is queued for each, and the thaw
//     lets each die before it runs another instruction. The sandbox's init
//     is among them, and the death of a pid namespace's init disables pid
//     allocation in that namespace before the kernel kills the rest.
//
// Then it waits, bounded, for the cgroup to be empty (cgroup.events on v2,
// the process list on v1), and starts over if something is left.

const (
	killRoundWait = 5 * time.Second  // first round's wait for an empty cgroup; grows per round
	killDeadline  = 90 * time.Second // all rounds together, unless ctx ends sooner
	freezeWait    = 2 * time.Second  // a task in uninterruptible sleep can hold FREEZING
)

// killCgroup ends every process in the sandbox's cgroup, setsid and
// double-forked ones included (cgroup membership cannot be escaped), and
// returns once the cgroup is empty.
func (r *Runtime) killCgroup(ctx context.Context, id string) error {
	dir := r.procsDir(id)
	v2 := ""
	if r.cg.unified != "" {
		if d := filepath.Join(r.cg.unified, r.cgroupsPath(id)); exists(filepath.Join(d, "cgroup.kill")) {
			v2 = d
		}
	}
	freezer := ""
	if fz := r.cg.controllers["freezer"]; fz != "" && !r.cg.v2 {
		if d := filepath.Join(fz, r.cgroupsPath(id)); exists(d) {
			freezer = d
		}
	}
	if !exists(dir) && v2 == "" {
		return nil
	}
	deadline := time.Now().Add(killDeadline)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	for round := 1; ; round++ {
		killRound(dir, v2, freezer)
		wait := min(time.Duration(round)*killRoundWait, time.Until(deadline))
		left, err := waitEmpty(ctx, dir, v2, wait)
		if err != nil {
			return err
		}
		if left == 0 {
			if round > 1 {
				r.log.Info("sandbox killed", "sandbox_id", id, "rounds", round)
			}
			return nil
		}
		if !time.Now().Before(deadline) || ctx.Err() != nil {
			return fmt.Errorf("cgroup %s still has %d processes after %d kill rounds", dir, left, round)
		}
		r.log.Warn("sandbox processes survived a kill round", "sandbox_id", id, "round", round, "left", left)
	}
}

// killRound stops forks, SIGKILLs every process and lets the signals land.
func killRound(dir, v2, freezer string) {
	if v2 != "" {
		_ = os.WriteFile(filepath.Join(v2, "cgroup.kill"), []byte("1"), 0)
	}
	state := ""
	if freezer != "" {
		state = filepath.Join(freezer, "freezer.state")
		if os.WriteFile(state, []byte("FROZEN"), 0) == nil {
			waitFrozen(state, freezeWait)
		}
	}
	if pids, err := cgroupProcs(dir); err == nil {
		for _, pid := range pids {
			_ = unix.Kill(pid, unix.SIGKILL)
		}
	}
	if state != "" {
		_ = os.WriteFile(state, []byte("THAWED"), 0)
	}
	if v2 != "" {
		// A frozen v2 cgroup's tasks die of SIGKILL anyway; thawing
		// keeps a paused sandbox's teardown from depending on that.
		_ = os.WriteFile(filepath.Join(v2, "cgroup.freeze"), []byte("0"), 0)
	}
}

// waitFrozen polls a v1 freezer until it reports FROZEN or the timeout
// passes. v1 has no event for it.
func waitFrozen(state string, timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		b, err := os.ReadFile(state)
		if err != nil || strings.TrimSpace(string(b)) == "FROZEN" {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// waitEmpty waits up to timeout for the cgroup to hold no process and
// returns how many are left. With a v2 directory it sleeps on
// cgroup.events (the kernel signals a change of "populated"); without one
// it polls the process list, SIGKILLing whatever is listed.
func waitEmpty(ctx context.Context, dir, v2 string, timeout time.Duration) (int, error) {
	deadline := time.Now().Add(timeout)
	if v2 != "" {
		if err := waitUnpopulated(ctx, v2, deadline); err != nil && !errors.Is(err, errTimeout) {
			return 0, err
		}
	}
	for {
		pids, err := cgroupProcs(dir)
		if err != nil {
			return 0, err
		}
		if len(pids) == 0 {
			return 0, nil
		}
		if !time.Now().Before(deadline) || ctx.Err() != nil {
			return len(pids), nil
		}
		for _, pid := range pids {
			_ = unix.Kill(pid, unix.SIGKILL)
		}
		time.Sleep(10 * time.Millisecond) // poll: v1 reports no event when a cgroup empties
	}
}

var errTimeout = errors.New("timed out")

// waitUnpopulated blocks until v2 cgroup dir's cgroup.events says
// "populated 0", the deadline passes (errTimeout) or ctx ends.
func waitUnpopulated(ctx context.Context, dir string, deadline time.Time) error {
	events := filepath.Join(dir, "cgroup.events")
	in, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return fmt.Errorf("inotify: %w", err)
	}
	defer unix.Close(in)
	if _, err := unix.InotifyAddWatch(in, events, unix.IN_MODIFY); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil // the cgroup is gone: nothing left in it
		}
		return fmt.Errorf("watch %s: %w", events, err)
	}
	buf := make([]byte, 4096)
	for {
		// Read after arming the watch, so a change in between is not lost.
		b, err := os.ReadFile(events)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		if strings.Contains(string(b), "populated 0") {
			return nil
		}
		left := time.Until(deadline)
		if left <= 0 {
			return errTimeout
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		// Wake at least every 100 ms to notice ctx.
		ms := int(min(left, 100*time.Millisecond)/time.Millisecond) + 1
		fds := []unix.PollFd{{Fd: int32(in), Events: unix.POLLIN}}
		if _, err := unix.Poll(fds, ms); err != nil && !errors.Is(err, unix.EINTR) {
			return fmt.Errorf("poll: %w", err)
		}
		for {
			if _, err := unix.Read(in, buf); err != nil {
				break // EAGAIN: drained
			}
		}
	}
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
