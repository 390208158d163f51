package runc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"sync"
	"syscall"
	"time"
)

// A runc or runsc CLI the daemon starts must never outlive it: a runsc
// left behind holds (or queues for) its container's flock, and every later
// runsc call on that sandbox, a restarted daemon's included, blocks behind
// it. So each one
//
//   - gets SIGKILL when the daemon dies (Pdeathsig);
//   - leads a process group of its own, which cancelling its context kills
//     whole, so a child it has not yet detached goes with it;
//   - is waited for at most cliWaitDelay past its exit or kill, should a
//     child hold its output pipes.
//
// `run --detach` and `restore --detach` leave the sandbox running: runsc
// starts the sentry and the gofer with setsid, out of the CLI's process
// group, and runc's container init calls setsid too. The parent-death
// signal is not inherited across fork, so it is the CLI's alone, and once
// the CLI has exited there is nothing left for it to fire on.
//
// The catch (go.dev/issue/27505): the kernel sends the parent-death signal
// when the *thread* that forked the child ends, not the process, and a Go
// thread ends whenever a goroutine exits while locked to it (as
// startInNetNS's does when it cannot move its thread back). A CLI forked
// from a thread some other goroutine later locks and leaves would be
// killed in the middle of its work. runPinned therefore forks and waits
// on one thread locked for the CLI's whole life.

// cliWaitDelay bounds the wait for a CLI's output once it has exited or
// been killed.
const cliWaitDelay = 5 * time.Second

// cli returns a command running the runtime CLI with args, bound to ctx
// as described above. Run it with runPinned.
func (r *Runtime) cli(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, r.cfg.Binary, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error {
		if err := syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); errors.Is(err, syscall.ESRCH) {
			return os.ErrProcessDone
		} else if err != nil {
			return err
		}
		return nil
	}
	cmd.WaitDelay = cliWaitDelay
	return cmd
}

// runPinned starts cmd, inside the network namespace at netns unless that
// is "", and waits for it, both from one OS thread locked for the whole
// time, so that cmd's parent-death signal fires only when the daemon dies.
func runPinned(cmd *exec.Cmd, netns string) error {
	errc := make(chan error, 1)
	go func() {
		goruntime.LockOSThread()
		back, err := true, error(nil)
		if netns == "" {
			err = cmd.Start()
		} else {
			back, err = inNetNS(netns, cmd.Start)
		}
		if cmd.Process != nil {
			// Started: reap it, whatever else failed.
			err = errors.Join(err, cmd.Wait())
		}
		if back {
			goruntime.UnlockOSThread()
		} // else the thread, stuck in another namespace, ends with the goroutine: after cmd is reaped
		errc <- err
	}()
	return <-errc
}

// command builds a runc invocation with the daemon's root and the
// sandbox's log file.
func (r *Runtime) command(ctx context.Context, id string, args ...string) *exec.Cmd {
	argv := append([]string{"--root", r.cfg.RuncRoot}, r.gvisorFlags()...)
	if id != "" {
		if _, err := os.Stat(r.dir(id)); err == nil {
			argv = append(argv, "--log", r.runcLog(id), "--log-format", "text")
			if r.cfg.GVisor != nil {
				// The sentry's own crash report, which would otherwise
				// go nowhere once runsc has detached.
				argv = append(argv, "--panic-log", r.panicLog(id))
			}
		}
	}
	return r.cli(ctx, append(argv, args...)...)
}

// runcOutput runs runc and returns its stdout; errors carry stderr. Its
// last argument is the sandbox's ID, as in every runc verb it runs; the
// call counts as in flight for it (removeState waits for those).
func (r *Runtime) runcOutput(ctx context.Context, args ...string) ([]byte, error) {
	id := args[len(args)-1]
	r.calls.begin(id)
	defer r.calls.end(id)
	argv := append([]string{"--root", r.cfg.RuncRoot}, r.gvisorFlags()...)
	cmd := r.cli(ctx, append(argv, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := runPinned(cmd, ""); err != nil {
		return stdout.Bytes(), fmt.Errorf("%s %s: %w: %s", filepath.Base(r.cfg.Binary), args[0], err, strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes(), nil
}

// inflight counts the runtime CLI calls under way per sandbox. runsc
// creates a container's lock file (O_CREAT) when it takes the container's
// flock, after finding its state file: a `runsc state` or `events` that
// found it just before Destroy removed the files would put the lock file
// back, for good. removeState therefore waits for the calls in flight.
type inflight struct {
	mu   sync.Mutex
	n    map[string]int
	idle map[string]chan struct{} // closed when n[id] drops to 0
}

func (f *inflight) begin(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n == nil {
		f.n = map[string]int{}
	}
	f.n[id]++
}

func (f *inflight) end(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n[id]--; f.n[id] > 0 {
		return
	}
	delete(f.n, id)
	if ch, ok := f.idle[id]; ok {
		close(ch)
		delete(f.idle, id)
	}
}

// inflightLimit bounds removeState's wait for the calls in flight.
const inflightLimit = 30 * time.Second

// wait returns once no call for id is in flight, or after limit (every
// call is bounded by its context; a sentry killed first answers none of
// them for long).
func (f *inflight) wait(id string, limit time.Duration) bool {
	f.mu.Lock()
	if f.n[id] == 0 {
		f.mu.Unlock()
		return true
	}
	if f.idle == nil {
		f.idle = map[string]chan struct{}{}
	}
	ch, ok := f.idle[id]
	if !ok {
		ch = make(chan struct{})
		f.idle[id] = ch
	}
	f.mu.Unlock()
	t := time.NewTimer(limit)
	defer t.Stop()
	select {
	case <-ch:
		return true
	case <-t.C:
		return false
	}
}
