package runc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// start lets a created container's init exec its process. runc's init
// waits for a reader on <root>/<id>/exec.fifo; `runc start` is that read
// plus ~20 ms of starting runc itself, so the read is done here directly,
// and `runc start` stays the fallback when the fifo is not where runc
// 1.x keeps it.
func (r *Runtime) start(ctx context.Context, id string, initPid int) error {
	fifo := filepath.Join(r.cfg.RuncRoot, id, "exec.fifo")
	if fi, err := os.Stat(fifo); err != nil || fi.Mode()&os.ModeNamedPipe == 0 {
		cmd := r.command(ctx, id, "start", id)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := runPinned(cmd, ""); err != nil {
			return fmt.Errorf("runc start: %w: %s%s", err, strings.TrimSpace(out.String()), r.logTail(id))
		}
		return nil
	}
	type result struct {
		n   int
		err error
	}
	done := make(chan result, 1)
	go func() {
		// Blocks until init has the fifo open for writing (it already
		// waits for us), then until init execs (its end is close-on-exec).
		f, err := os.OpenFile(fifo, os.O_RDONLY, 0)
		if err != nil {
			done <- result{err: err}
			return
		}
		defer f.Close()
		b, err := io.ReadAll(f)
		done <- result{n: len(b), err: err}
	}()
	timeout := time.NewTimer(10 * time.Second)
	defer timeout.Stop()
	select {
	case res := <-done:
		os.Remove(fifo)
		if res.err != nil {
			return fmt.Errorf("start via exec fifo: %w", res.err)
		}
		if res.n == 0 {
			return fmt.Errorf("start: init exited before it started its process%s", r.logTail(id))
		}
		return nil
	case <-timeout.C:
	case <-ctx.Done():
	}
	// Init died or never opened its end: unblock our reader by opening
	// the writing end ourselves, then report the failure.
	if w, err := os.OpenFile(fifo, os.O_WRONLY|unix.O_NONBLOCK, 0); err == nil {
		w.Close()
	}
	<-done
	os.Remove(fifo)
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("start: %w", err)
	}
	if unix.Kill(initPid, 0) != nil {
		return errors.New("start: init is gone" + r.logTail(id))
	}
	return errors.New("start: init did not take the start signal within 10s")
}
