package runtimetest

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/runtime"
)

// Stopper is the optional ability to end a sandbox's processes keeping its
// disk, and to start its agent again on that disk.
type Stopper interface {
	Stop(ctx context.Context, id string) error
	Start(ctx context.Context, spec runtime.Spec) error
}

// testStopStart: a stopped sandbox holds nothing but its disk (no mount,
// loop device, cgroup, process or runtime state), a file written before
// the stop is there after the start, the start may be repeated after a
// second stop, and a stopped sandbox is destroyed without a trace.
func testStopStart(t *testing.T, h Harness) {
	inst := h.New(t)
	s, ok := inst.Backend.(Stopper)
	if !ok {
		t.Skip("backend has no Stop/Start")
	}
	if inst.Exec == nil {
		t.Skip("harness has no Exec")
	}
	ctx := t.Context()
	id, spec := start(t, h, inst)
	if out, err := inst.Exec(ctx, id, "/bin/sh", "-c", "echo kept > /kept"); err != nil {
		t.Fatalf("write: %v: %s", err, out)
	}
	for round := range 2 {
		if err := s.Stop(ctx, id); err != nil {
			t.Fatalf("Stop = %v", err)
		}
		if err := s.Stop(ctx, id); err != nil {
			t.Fatalf("second Stop = %v, want nil (idempotent)", err)
		}
		if st, err := inst.Backend.Inspect(ctx, id); err != nil || st.Status == runtime.StatusRunning {
			t.Errorf("Inspect after Stop = %+v, %v; want not running", st, err)
		}
		for _, l := range StoppedSandboxLeaks(inst.Footprint, id) {
			t.Errorf("round %d: stopped sandbox holds %s", round, l)
		}
		if err := s.Start(ctx, spec); err != nil {
			t.Fatalf("Start = %v", err)
		}
		if st, err := inst.Backend.Inspect(ctx, id); err != nil || st.Status != runtime.StatusRunning {
			t.Fatalf("Inspect after Start = %+v, %v; want running", st, err)
		}
		out, err := inst.Exec(ctx, id, "/bin/cat", "/kept")
		if err != nil || strings.TrimSpace(string(out)) != "kept" {
			t.Fatalf("round %d: file after Start = %q, %v; want kept", round, out, err)
		}
	}
	if err := s.Start(ctx, spec); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("Start of a running sandbox = %v, want ErrFailedPrecondition", err)
	}
	if err := s.Stop(ctx, NewID()); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Stop(unknown) = %v, want ErrNotFound", err)
	}
	if err := s.Stop(ctx, id); err != nil {
		t.Fatalf("Stop = %v", err)
	}
	if err := inst.Backend.Destroy(ctx, id); err != nil {
		t.Fatalf("Destroy stopped = %v", err)
	}
	assertGone(t, inst, id)
}
