package daemon

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/agentlink"
	"github.com/berth-sandbox/berth/internal/template"
)

// starter runs templates' start commands and ready checks over the agent
// (sandbox.Starter).
type starter struct{ link *agentlink.Link }

// readyPoll bounds the pause between two tries of a ready check; the first
// tries follow each other quickly, since most services come up fast.
const (
	readyPollMin = 10 * time.Millisecond
	readyPollMax = 250 * time.Millisecond
	// readyCmdTimeout bounds one run of a ready command.
	readyCmdTimeout = 10 * time.Second
)

func (s starter) Start(ctx context.Context, addr, token string, d template.Defaults) error {
	var bg *agentlink.Background
	if len(d.Start) > 0 {
		var err error
		bg, err = s.link.Start(ctx, addr, token, agentlink.Command{Argv: d.Start})
		if err != nil {
			return fmt.Errorf("start command %q: %w", strings.Join(d.Start, " "), err)
		}
		// The process keeps running; only the watch ends.
		defer bg.Close()
	}
	if d.Ready == nil {
		return nil
	}
	r := *d.Ready
	timeout := r.Timeout()
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var ended <-chan struct{}
	if bg != nil {
		ended = bg.Ended()
	}
	pause := readyPollMin
	var last string
	for {
		ok, detail, err := s.check(rctx, addr, token, r)
		if ok {
			return nil
		}
		if err != nil {
			last = err.Error()
		} else {
			last = detail
		}
		t := time.NewTimer(pause)
		select {
		case <-ended:
			t.Stop()
			if res, done := bg.Result(); done {
				return fmt.Errorf("start command %q ended (%s) before the %s passed; its last output: %q: %w",
					strings.Join(d.Start, " "), res.Status, r, bg.Tail(), errdefs.ErrFailedPrecondition)
			}
			ended = nil // the watch was lost, not the process: keep checking
		case <-rctx.Done():
			t.Stop()
			if err := ctx.Err(); err != nil {
				return fmt.Errorf("%s: %w", r, err)
			}
			return fmt.Errorf("%s did not pass within %s (last try: %s): %w", r, timeout, last, errdefs.ErrDeadlineExceeded)
		case <-t.C:
		}
		pause = min(2*pause, readyPollMax)
	}
}

// check runs the ready check once.
func (s starter) check(ctx context.Context, addr, token string, r template.ReadyCheck) (bool, string, error) {
	switch {
	case r.Cmd != "":
		var out tailWriter
		res, err := s.link.Run(ctx, addr, token, agentlink.Command{Argv: []string{"/bin/sh", "-c", r.Cmd}, Stdout: &out, Stderr: &out, Timeout: readyCmdTimeout})
		if err != nil {
			return false, "", err
		}
		if res.Exited && res.ExitCode == 0 {
			return true, "", nil
		}
		return false, fmt.Sprintf("%s, output %q", res.Status, out.String()), nil
	case r.Port != 0:
		ok, err := s.link.Listening(ctx, addr, token, r.Port)
		return ok, fmt.Sprintf("nothing listens on port %d", r.Port), err
	case r.File != "":
		ok, err := s.link.Exists(ctx, addr, token, r.File)
		return ok, r.File + " does not exist", err
	}
	return false, "", fmt.Errorf("empty ready check: %w", errdefs.ErrInvalidArgument)
}

// tailWriter keeps the last 512 bytes written to it.
type tailWriter struct{ b []byte }

func (w *tailWriter) Write(p []byte) (int, error) {
	w.b = append(w.b, p...)
	if len(w.b) > 512 {
		w.b = w.b[len(w.b)-512:]
	}
	return len(p), nil
}

func (w *tailWriter) String() string { return string(w.b) }
