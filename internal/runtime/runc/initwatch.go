package runc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
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
	st, err := r.Inspect(ctx, id)
	if err != nil {
		return nil, err
	}
	done := make(chan struct{})
	if st.Status == runtime.StatusStopped || st.Pid <= 0 {
		close(done)
		return done, nil
	}
	fd, err := unix.PidfdOpen(st.Pid, 0)
	if errors.Is(err, unix.ESRCH) {
		close(done)
		return done, nil
	}
	if err != nil {
		return nil, fmt.Errorf("watch sandbox %s init %d: %w", id, st.Pid, err)
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
