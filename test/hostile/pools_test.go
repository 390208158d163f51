package hostile

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/test/harness"
)

// TestSharedKernelPools attacks kernel pools that are counted per host
// uid, per user namespace or host-wide. The attacker takes all it can of
// each pool, across as many of its uids as it likes, and holds it; the
// host then checks that its own root still gets the resource, that the
// neighbour still does, and that the daemon still answers.
func TestSharedKernelPools(t *testing.T) {
	l := newLab(t, client.CreateRequest{})
	l.copyAttacker(t, l.nb)
	// Pools counted per host uid are the neighbour's own only when the
	// neighbour's uids are not the attacker's (per-sandbox uid ranges).
	ownUIDs := sandboxUID(t, l.d, l.sb.ID) != sandboxUID(t, l.d, l.nb.ID)

	// Calls the seccomp profile refuses, so the pools behind them are
	// never the sandbox's to fill.
	for _, a := range []string{"io-setup", "fanotify", "socket-vsock", "socket-vsock-highbits", "sched-fifo"} {
		t.Run(a, func(t *testing.T) {
			l.attack(t, a)
			l.check(t)
		})
	}

	pools := []struct {
		kind string
		// max is the most the attacker may get, 0 for no bound to check.
		max int
		// host is host root taking one of the pool.
		host func() error
		// perUID: the pool is counted per host uid (ucounts), so the
		// neighbour keeps its share only with uids of its own.
		perUID bool
	}{
		{"inotify", 0, hostInotify, true},
		{"timers", 0, hostTimer, true},
		{"mqueue", 0, hostMqueue, true},
		{"pty", 256, hostPTY, false},
		// Counted per host uid (user_struct), not per namespace.
		{"pipes", 0, hostPipe, true},
		{"scm", 0, hostRights, true},
	}
	for _, p := range pools {
		t.Run("hog-"+p.kind, func(t *testing.T) {
			if err := p.host(); err != nil {
				t.Fatalf("host root cannot take a %s before the attack: %v", p.kind, err)
			}
			l.neighbourTakes(t, p.kind)
			held := l.hog(t, p.kind)
			if p.max > 0 && held > p.max {
				t.Errorf("attacker holds %d of %s, want at most %d", held, p.kind, p.max)
			}
			if err := p.host(); err != nil {
				t.Errorf("host root's own %s failed while the attacker holds %d: %v", p.kind, held, err)
			}
			if !p.perUID || ownUIDs {
				l.neighbourTakes(t, p.kind)
			} else {
				t.Logf("neighbour shares the attacker's host uids; its %s share is not its own", p.kind)
			}
			if _, err := l.d.Client.List(t.Context(), client.ListOptions{}); err != nil {
				t.Errorf("daemon does not answer: %v", err)
			}
			l.check(t)
		})
	}

	t.Run("daemon-creates", func(t *testing.T) {
		// With every hog still holding, a new sandbox comes up and runs.
		sb := l.d.Create(t, client.CreateRequest{})
		harness.MustRun(t, sb, "true")
	})
}

// hog starts the attack tool's hog of kind in the attacker sandbox and
// returns how much it holds once it says so. The hog keeps holding until
// the test ends.
func (l *lab) hog(t *testing.T, kind string) int {
	t.Helper()
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	t.Cleanup(cancel)
	w := &lineWaiter{want: "holding:", found: make(chan string, 1)}
	done := make(chan error, 1)
	go func() {
		_, err := l.sb.Exec(ctx, client.ExecRequest{Cmd: "/tmp/attacker", Args: []string{"hog", kind}, Stdout: w, Stderr: w})
		done <- err
	}()
	select {
	case line := <-w.found:
		t.Logf("%s", line)
		f := strings.Fields(line)
		if len(f) < 3 {
			t.Fatalf("hog said %q", line)
		}
		n, err := strconv.Atoi(f[2])
		if err != nil {
			t.Fatalf("hog said %q", line)
		}
		return n
	case err := <-done:
		t.Fatalf("hog %s ended before holding: %v\n%s", kind, err, w.all())
	case <-time.After(3 * time.Minute):
		t.Fatalf("hog %s did not report within 3 minutes\n%s", kind, w.all())
	}
	return 0
}

// neighbourTakes checks that the neighbour still gets one of kind, through
// the API where the API uses the pool (file watches, terminals).
func (l *lab) neighbourTakes(t *testing.T, kind string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	switch kind {
	case "inotify":
		// A file watch through the API is an inotify instance in the
		// neighbour's agent.
		ready := make(chan struct{})
		errc := make(chan error, 1)
		wctx, wcancel := context.WithCancel(ctx)
		defer wcancel()
		go func() {
			errc <- l.nb.WatchDirNotify(wctx, "/tmp", false, func() { close(ready) }, func(client.FileEvent) error { return nil })
		}()
		select {
		case <-ready:
		case err := <-errc:
			t.Errorf("neighbour's file watch failed: %v", err)
		case <-ctx.Done():
			t.Errorf("neighbour's file watch did not start")
		}
	case "pty":
		// What `berth shell` does.
		p, err := l.nb.StartPTY(ctx, client.PTYRequest{Cmd: "/bin/sh"})
		if err != nil {
			t.Errorf("neighbour's terminal failed: %v", err)
			return
		}
		p.Kill()
	default:
		o, e, code := l.exec(t, l.nb, "/tmp/attacker", "take-one", kind)
		if code != 0 {
			t.Errorf("neighbour cannot take a %s: %s %s", kind, o, e)
		}
	}
}

// lineWaiter is an io.Writer that reports the first line starting with
// want.
type lineWaiter struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	want  string
	found chan string
	sent  bool
}

func (w *lineWaiter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if !w.sent {
		for _, line := range strings.Split(w.buf.String(), "\n") {
			if strings.HasPrefix(line, w.want) && strings.HasSuffix(w.buf.String(), "\n") {
				w.found <- line
				w.sent = true
				break
			}
		}
	}
	return len(p), nil
}

func (w *lineWaiter) all() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

var _ io.Writer = (*lineWaiter)(nil)

// The host root's own takes, one of each pool, released at once.

func hostInotify() error {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
	if err != nil {
		return fmt.Errorf("inotify_init1: %w", err)
	}
	return unix.Close(fd)
}

// hostTimer creates and deletes a POSIX timer: its signal is charged to
// host root's queued-signal count, as a sigqueue is.
func hostTimer() error {
	var ev [64]byte
	*(*int32)(unsafe.Pointer(&ev[12])) = 1 // SIGEV_NONE
	var id int32
	if _, _, e := unix.RawSyscall(unix.SYS_TIMER_CREATE, uintptr(unix.CLOCK_MONOTONIC), uintptr(unsafe.Pointer(&ev[0])), uintptr(unsafe.Pointer(&id))); e != 0 {
		return fmt.Errorf("timer_create: %w", e)
	}
	if _, _, e := unix.RawSyscall(unix.SYS_TIMER_DELETE, uintptr(id), 0, 0); e != 0 {
		return fmt.Errorf("timer_delete: %w", e)
	}
	return nil
}

// hostMqueue creates and removes a POSIX message queue of 10 × 8 KiB in
// the host's IPC namespace, charged to host root's RLIMIT_MSGQUEUE.
func hostMqueue() error {
	name := "berth-hostile-" + randHex(4)
	p, err := unix.BytePtrFromString(name)
	if err != nil {
		return err
	}
	attr := [8]int64{0, 10, 8192}
	fd, _, e := unix.RawSyscall6(unix.SYS_MQ_OPEN, uintptr(unsafe.Pointer(p)), unix.O_CREAT|unix.O_EXCL|unix.O_RDWR|unix.O_CLOEXEC, 0o600, uintptr(unsafe.Pointer(&attr[0])), 0, 0)
	if e != 0 {
		return fmt.Errorf("mq_open: %w", e)
	}
	unix.Close(int(fd))
	if _, _, e := unix.RawSyscall(unix.SYS_MQ_UNLINK, uintptr(unsafe.Pointer(p)), 0, 0); e != 0 {
		return fmt.Errorf("mq_unlink: %w", e)
	}
	return nil
}

// hostPTY is posix_openpt on the host's devpts.
func hostPTY() error {
	fd, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("posix_openpt: %w", err)
	}
	return unix.Close(fd)
}

// hostPipe is a 1 MiB pipe, the size fs.pipe-user-pages-soft counts.
func hostPipe() error {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		return fmt.Errorf("pipe: %w", err)
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	if _, err := unix.FcntlInt(uintptr(p[0]), unix.F_SETPIPE_SZ, 1<<20); err != nil {
		return fmt.Errorf("F_SETPIPE_SZ: %w", err)
	}
	return nil
}

// hostRights passes a descriptor over a unix socket (SCM_RIGHTS).
func hostRights() error {
	p, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("socketpair: %w", err)
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	if err := unix.Sendmsg(p[0], []byte{'x'}, unix.UnixRights(p[1]), nil, 0); err != nil {
		return fmt.Errorf("sendmsg(SCM_RIGHTS): %w", err)
	}
	return nil
}
