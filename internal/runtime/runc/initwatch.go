package runc

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/berth-sandbox/berth/internal/runtime"
)

// InitExited returns a channel that is closed once the sandbox's init
// (the agent under runc, the sandbox's runsc process under gVisor) has
// exited, or at once if it is not running. The kernel reports the exit
// through a pidfd: nothing is polled on the runtime. Watching ends with
// ctx; the channel then stays open.
func (r *Runtime) InitExited(ctx context.Context, id string) (<-chan struct{}, error) {
	pid, known := r.runcInit(id)
	if !known {
		st, err := r.Inspect(ctx, id)
		if err != nil {
			return nil, err
		}
		pid = st.Pid
		if st.Status == runtime.StatusStopped {
			pid = 0
		}
	}
	done := make(chan struct{})
	if pid <= 0 {
		close(done)
		return done, nil
	}
	fd, err := unix.PidfdOpen(pid, 0)
	if errors.Is(err, unix.ESRCH) {
		close(done)
		return done, nil
	}
	if err != nil {
		return nil, fmt.Errorf("watch sandbox %s init %d: %w", id, pid, err)
	}
	go func() {
		defer unix.Close(fd)
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		for ctx.Err() == nil {
			// Bounded, so an ended ctx is seen within the bound.
			n, err := unix.Poll(fds, 250)
			if errors.Is(err, unix.EINTR) || (err == nil && n == 0) {
				continue
			}
			if err == nil {
				close(done)
			}
			return
		}
	}()
	return done, nil
}

// runcInit is the host pid of runc sandbox id's init as runc's state file
// records it, 0 if that process has ended, and known false when the file
// does not settle it (gVisor, no file, a file it cannot read): the caller
// then asks the runtime. It spares a create that watches its init a `runc
// state`, a process start of 10 to 20 ms, which in a burst of creates on a
// busy host adds up. runc writes the file by rename, so a read never sees
// half of it. The recorded start time (in clock ticks since boot, as
// /proc/<pid>/stat's 22nd field) tells the init from a later process that
// got its number.
func (r *Runtime) runcInit(id string) (pid int, known bool) {
	if r.cfg.GVisor != nil || checkID(id) != nil {
		return 0, false
	}
	b, err := os.ReadFile(filepath.Join(r.cfg.RuncRoot, id, "state.json"))
	if err != nil {
		return 0, false
	}
	var st struct {
		Pid   int    `json:"init_process_pid"`
		Start uint64 `json:"init_process_start"`
	}
	if err := json.Unmarshal(b, &st); err != nil || st.Pid <= 0 || st.Start == 0 {
		return 0, false
	}
	start, err := procStartTime(r.procRoot(), st.Pid)
	if errors.Is(err, os.ErrNotExist) || (err == nil && start != st.Start) {
		return 0, true
	}
	if err != nil {
		return 0, false
	}
	return st.Pid, true
}

// runcStateFromFile is what `runc state` would answer for runc sandbox
// id, worked out as runc itself does (libcontainer's refreshState) from
// its state file and the host: a frozen (or freezing) cgroup is paused;
// an init that is gone, a zombie, or another process by now (runcInit) is
// stopped; an exec fifo still in runc's state dir is created (`runc
// start` has not read it); else running. settled is false when the file
// does not say (gVisor, no file yet: a `runc create` under way): the
// caller asks runc. The monitor inspects every sandbox once a second,
// and a `runc state` is a process start of 10 to 20 ms of CPU: at a few
// hundred sandboxes, whole cores.
func (r *Runtime) runcStateFromFile(id string) (st runcState, settled bool) {
	pid, known := r.runcInit(id)
	if !known {
		return st, false
	}
	st = runcState{ID: id, Status: "stopped"}
	if pid == 0 || procZombie(r.procRoot(), pid) {
		return st, true
	}
	st.Pid = pid
	switch {
	case r.cgroupFrozen(id):
		st.Status = "paused"
	case exists(filepath.Join(r.cfg.RuncRoot, id, "exec.fifo")):
		st.Status = "created"
	default:
		st.Status = "running"
	}
	return st, true
}

// procZombie reports whether process pid has exited and waits to be
// reaped (or is dead): the state field of <proc>/<pid>/stat. A process
// that is gone altogether is not a zombie (runcInit tells that).
func procZombie(proc string, pid int) bool {
	b, err := os.ReadFile(filepath.Join(proc, strconv.Itoa(pid), "stat"))
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return false
	}
	s := b[i+2]
	return s == 'Z' || s == 'X' || s == 'x'
}

// procStartTime is process pid's start time in clock ticks after boot,
// the 22nd field of <proc>/<pid>/stat (the 20th after the command name,
// which may hold spaces and parentheses, so it is cut at its last ')').
func procStartTime(proc string, pid int) (uint64, error) {
	b, err := os.ReadFile(filepath.Join(proc, strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("%s/%d/stat: no command name", proc, pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return 0, fmt.Errorf("%s/%d/stat: %d fields after the command name", proc, pid, len(f))
	}
	return strconv.ParseUint(f[19], 10, 64)
}

// AgentLogTail is the end of the sandbox agent's own log (its stdout and
// stderr, AgentLog), at most the last three lines, or "" if it wrote none:
// what an agent that died while starting said last. The file lives in the
// sandbox's disk beside its writable layer, out of the sandbox's reach; a
// link there is still not followed.
func (r *Runtime) AgentLogTail(id string) string {
	if checkID(id) != nil {
		return ""
	}
	lines := strings.Split(fileTail(r.AgentLog(id), 1024, true), "\n")
	if len(lines) > 3 {
		lines = lines[len(lines)-3:]
	}
	return strings.TrimSpace(strings.Join(lines, " | "))
}

// fileTail is the last max bytes of the regular file at path, trimmed, or
// "" if it cannot be read; with noFollow, a link is not followed.
func fileTail(path string, max int64, noFollow bool) string {
	flags := os.O_RDONLY | unix.O_NONBLOCK
	if noFollow {
		flags |= unix.O_NOFOLLOW
	}
	f, err := os.OpenFile(path, flags, 0)
	if err != nil {
		return ""
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		return ""
	}
	if fi.Size() > max {
		if _, err := f.Seek(fi.Size()-max, io.SeekStart); err != nil {
			return ""
		}
	}
	b, err := io.ReadAll(io.LimitReader(f, max))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}
