package sandbox

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/core"
	"github.com/berth-sandbox/berth/internal/runtime"
	"github.com/berth-sandbox/berth/internal/store"
	"github.com/berth-sandbox/berth/internal/template"
)

// isoTemplates has "minimal" (no default level) and "strong" (gvisor).
type isoTemplates struct{}

func (isoTemplates) Get(ctx context.Context, name string) (template.Template, error) {
	switch name {
	case "minimal":
		return template.Template{Name: name, Built: true, Layers: []string{"/x"}}, nil
	case "strong":
		return template.Template{Name: name, Built: true, Layers: []string{"/x"}, Isolation: core.IsolationGVisor}, nil
	}
	return template.Template{}, errdefs.ErrNotFound
}

type isoFixture struct {
	runc, gvisor *fakeRuntime
	net          *fakeNet
	db           *store.DB
}

func newIsoFixture(t *testing.T) *isoFixture {
	t.Helper()
	db, err := store.Open(t.Context(), filepath.Join(t.TempDir(), "b.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return &isoFixture{
		runc:   &fakeRuntime{running: map[string]runtime.Status{}},
		gvisor: &fakeRuntime{running: map[string]runtime.Status{}},
		net:    &fakeNet{ids: map[string]bool{}},
		db:     db,
	}
}

// manager starts a Manager offering runc and, with gvisor, gVisor.
func (f *isoFixture) manager(t *testing.T, gvisor bool) *Manager {
	t.Helper()
	rts := map[string]Runtime{core.IsolationRunc: f.runc}
	unavailable := map[string]string{}
	if gvisor {
		rts[core.IsolationGVisor] = f.gvisor
	} else {
		unavailable[core.IsolationGVisor] = "runsc not found; install it with `apt-get install runsc`"
	}
	m, err := New(Config{
		AgentPath: "/agent", DefaultTemplate: "minimal",
		Defaults:        Limits{CPUMillis: 1000, MemoryBytes: 256 << 20, DiskBytes: 1 << 30, PidsLimit: 100},
		Max:             Limits{CPUMillis: 4000, MemoryBytes: 4 << 30, DiskBytes: 8 << 30, PidsLimit: 1000},
		Unavailable:     unavailable,
		RuntimeVersions: map[string]string{core.IsolationRunc: "runc 1", core.IsolationGVisor: "runsc 2 (ptrace)"},
		Logger:          slog.New(slog.DiscardHandler),
	}, Deps{Runtimes: rts, Network: f.net, Templates: isoTemplates{}, Store: f.db, Prober: fakeProber{}})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	return m
}

func (f *isoFixture) has(rt *fakeRuntime, id string) bool {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	_, ok := rt.running[id]
	return ok
}

// TestIsolationChoosesRuntime: the request's level, else the template's,
// else the daemon's, decides which runtime makes the sandbox, and every
// later call (destroy) goes to that runtime only.
func TestIsolationChoosesRuntime(t *testing.T) {
	f := newIsoFixture(t)
	m := f.manager(t, true)
	for _, tc := range []struct {
		name     string
		req      CreateRequest
		want     string
		wantVers string
	}{
		{"daemon default", CreateRequest{}, core.IsolationRunc, "runc 1"},
		{"request", CreateRequest{Isolation: core.IsolationGVisor}, core.IsolationGVisor, "runsc 2 (ptrace)"},
		{"template default", CreateRequest{Template: "strong"}, core.IsolationGVisor, "runsc 2 (ptrace)"},
		{"request over template", CreateRequest{Template: "strong", Isolation: core.IsolationRunc}, core.IsolationRunc, "runc 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sb, err := m.Create(t.Context(), tc.req)
			if err != nil {
				t.Fatal(err)
			}
			if sb.Isolation != tc.want || sb.RuntimeVersion != tc.wantVers {
				t.Errorf("Create(%+v) isolation %q runtime %q, want %q, %q", tc.req, sb.Isolation, sb.RuntimeVersion, tc.want, tc.wantVers)
			}
			on, off := f.runc, f.gvisor
			if tc.want == core.IsolationGVisor {
				on, off = f.gvisor, f.runc
			}
			if !f.has(on, sb.ID) || f.has(off, sb.ID) {
				t.Errorf("sandbox %s not (only) in the %s runtime", sb.ID, tc.want)
			}
			if got, _ := f.db.GetSandbox(t.Context(), sb.ID); got.Isolation != tc.want {
				t.Errorf("stored isolation %q, want %q", got.Isolation, tc.want)
			}
			if err := m.Destroy(t.Context(), sb.ID, "test"); err != nil {
				t.Fatal(err)
			}
			if f.has(on, sb.ID) {
				t.Errorf("destroy left sandbox %s in the %s runtime", sb.ID, tc.want)
			}
		})
	}
}

// TestIsolationRefusals: an unknown level is invalid, a known level the
// daemon cannot offer is a failed precondition saying what to install;
// both name the field and neither falls back to runc.
func TestIsolationRefusals(t *testing.T) {
	f := newIsoFixture(t)
	m := f.manager(t, false)
	for _, tc := range []struct {
		req      CreateRequest
		want     error
		wantText string
	}{
		{CreateRequest{Isolation: "kata"}, errdefs.ErrInvalidArgument, `isolation "kata": want one of runc, gvisor`},
		{CreateRequest{Isolation: core.IsolationGVisor}, errdefs.ErrFailedPrecondition, "apt-get install runsc"},
		{CreateRequest{Template: "strong"}, errdefs.ErrFailedPrecondition, "the template's default isolation"},
	} {
		_, err := m.Create(t.Context(), tc.req)
		var fe *FieldError
		if !errors.Is(err, tc.want) || !errors.As(err, &fe) || fe.Field != "isolation" || !strings.Contains(err.Error(), tc.wantText) {
			t.Errorf("Create(%+v) = %v, want %v on field isolation saying %q", tc.req, err, tc.want, tc.wantText)
		}
	}
	if all, _ := m.List(t.Context(), ListOptions{}); len(all) != 0 || len(f.runc.running) != 0 {
		t.Errorf("refused creates left records %+v or runc sandboxes %v", all, f.runc.running)
	}
}

// TestIsolationReconcile: after a restart each level's sandboxes are
// adopted through their own runtime, and each runtime's orphans are
// removed by that runtime.
func TestIsolationReconcile(t *testing.T) {
	f := newIsoFixture(t)
	m := f.manager(t, true)
	gv, err := m.Create(t.Context(), CreateRequest{Isolation: core.IsolationGVisor})
	if err != nil {
		t.Fatal(err)
	}
	rc, err := m.Create(t.Context(), CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	m.Close()
	f.runc.running["orphanrunc"] = runtime.StatusRunning
	f.gvisor.running["orphangvisor"] = runtime.StatusRunning
	m2 := f.manager(t, true)
	for _, id := range []string{gv.ID, rc.ID} {
		if got, _ := m2.Get(t.Context(), id); State(got.State) != StateReady {
			t.Errorf("sandbox %s after restart: %s %q", id, got.State, got.Reason)
		}
	}
	if f.has(f.runc, "orphanrunc") || f.has(f.gvisor, "orphangvisor") {
		t.Errorf("orphans survived reconcile: runc %v, gvisor %v", f.runc.running, f.gvisor.running)
	}
	if !f.has(f.gvisor, gv.ID) || !f.has(f.runc, rc.ID) {
		t.Errorf("adopted sandboxes lost: runc %v, gvisor %v", f.runc.running, f.gvisor.running)
	}
	m2.Close()
	// A daemon restarted without gVisor fails the gVisor sandbox with the
	// reason instead of handing it to runc.
	m3 := f.manager(t, false)
	got, _ := m3.Get(t.Context(), gv.ID)
	if State(got.State) != StateFailed || !strings.Contains(got.Reason, "apt-get install runsc") {
		t.Errorf("gvisor sandbox on a daemon without gvisor: %s %q, want failed naming runsc", got.State, got.Reason)
	}
	if got, _ := m3.Get(t.Context(), rc.ID); State(got.State) != StateReady {
		t.Errorf("runc sandbox on a daemon without gvisor: %s %q", got.State, got.Reason)
	}
}

// TestPidsFitMemory: the pids limit is at most one task per 2 MiB of
// memory under gVisor and one per 256 KiB under runc (fitPids): a default
// above it is lowered, one the request asked for is refused naming pids
// and leaves nothing behind; at or below it the limit is what was asked
// or defaulted.
func TestPidsFitMemory(t *testing.T) {
	f := newIsoFixture(t)
	m := f.manager(t, true)
	gv := core.IsolationGVisor
	for _, tc := range []struct {
		name string
		req  CreateRequest
		want int64 // 0: refused
	}{
		{"gvisor default lowered", CreateRequest{Isolation: gv, Limits: Limits{MemoryBytes: 128 << 20}}, 64},
		{"template's gvisor default lowered", CreateRequest{Template: "strong", Limits: Limits{MemoryBytes: 64 << 20}}, 32},
		{"gvisor default that fits", CreateRequest{Isolation: gv}, 100},
		{"gvisor asked at the ceiling", CreateRequest{Isolation: gv, Limits: Limits{MemoryBytes: 256 << 20, PidsLimit: 128}}, 128},
		{"gvisor floor", CreateRequest{Isolation: gv, Limits: Limits{MemoryBytes: 16 << 20}}, MinLimits.PidsLimit},
		{"runc default kept", CreateRequest{Limits: Limits{MemoryBytes: 128 << 20}}, 100},
		{"runc asked at the ceiling", CreateRequest{Limits: Limits{MemoryBytes: 128 << 20, PidsLimit: 512}}, 512},
		{"runc default lowered", CreateRequest{Limits: Limits{MemoryBytes: 16 << 20}}, 64},
		{"runc asked above", CreateRequest{Limits: Limits{MemoryBytes: 16 << 20, PidsLimit: 65}}, 0},
		{"gvisor asked above", CreateRequest{Isolation: gv, Limits: Limits{MemoryBytes: 256 << 20, PidsLimit: 129}}, 0},
		{"template's gvisor asked above", CreateRequest{Template: "strong", Limits: Limits{MemoryBytes: 64 << 20, PidsLimit: 100}}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before, _ := m.List(t.Context(), ListOptions{})
			sb, err := m.Create(t.Context(), tc.req)
			if tc.want == 0 {
				var fe *FieldError
				if !errors.Is(err, errdefs.ErrInvalidArgument) || !errors.As(err, &fe) || fe.Field != "pids" || !strings.Contains(err.Error(), "raise memory") {
					t.Fatalf("Create(%+v) = %v, want invalid_argument on pids saying to raise memory", tc.req, err)
				}
				if after, _ := m.List(t.Context(), ListOptions{}); len(after) != len(before) {
					t.Errorf("a refused create left a record: %d sandboxes, were %d", len(after), len(before))
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if sb.PidsLimit != tc.want {
				t.Errorf("pids limit %d, want %d", sb.PidsLimit, tc.want)
			}
			if got, _ := f.db.GetSandbox(t.Context(), sb.ID); got.PidsLimit != tc.want {
				t.Errorf("stored pids limit %d, want %d", got.PidsLimit, tc.want)
			}
			if err := m.Destroy(t.Context(), sb.ID, "test"); err != nil {
				t.Fatal(err)
			}
		})
	}
}
