package sandbox

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/runtime"
	"github.com/berth-sandbox/berth/internal/store"
	"github.com/berth-sandbox/berth/internal/template"
)

// fakeRuntime records sandboxes in memory. Unit tests only: the end-to-end
// suite runs the real runc backend.
type fakeRuntime struct {
	mu      sync.Mutex
	running map[string]runtime.Status
	// failOn is "create" (fail before making anything) or "start" (fail
	// after BeforeStart, leaving the container behind).
	failOn string
	// started, when set, runs once the container is made and may block:
	// a slow runtime.
	started func(ctx context.Context, id string) error
}

func (f *fakeRuntime) Create(ctx context.Context, spec runtime.Spec) error {
	f.mu.Lock()
	failOn, started := f.failOn, f.started
	if failOn == "create" {
		f.mu.Unlock()
		return errors.New("runtime exploded")
	}
	f.running[spec.ID] = runtime.StatusCreated
	f.mu.Unlock()
	if spec.BeforeStart != nil {
		if err := spec.BeforeStart(ctx, 4242); err != nil {
			return err
		}
	}
	if failOn == "start" {
		return errors.New("runtime start exploded")
	}
	if started != nil {
		if err := started(ctx, spec.ID); err != nil {
			return err
		}
	}
	f.mu.Lock()
	f.running[spec.ID] = runtime.StatusRunning
	f.mu.Unlock()
	return nil
}

func (f *fakeRuntime) Destroy(ctx context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.running, id)
	return nil
}

func (f *fakeRuntime) Inspect(ctx context.Context, id string) (runtime.State, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	st, ok := f.running[id]
	if !ok {
		return runtime.State{}, errdefs.ErrNotFound
	}
	if st == statusUnresponsive {
		return runtime.State{}, fmt.Errorf("inspect sandbox %s: runsc unresponsive: %w", id, errdefs.ErrUnavailable)
	}
	return runtime.State{ID: id, Status: st, Pid: 42}, nil
}

// statusUnresponsive, in fakeRuntime.running, is a sandbox whose runtime
// does not answer Inspect (a wedged gVisor sentry); Stop still works.
const statusUnresponsive runtime.Status = "unresponsive"

func (f *fakeRuntime) List(ctx context.Context) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var ids []string
	for id := range f.running {
		ids = append(ids, id)
	}
	return ids, nil
}

type fakeNet struct {
	mu  sync.Mutex
	ids map[string]bool
	// failAttach fails AttachTo half-way, leaving its link behind.
	failAttach bool
}

func (f *fakeNet) AttachTo(ctx context.Context, id, nsPath string) (Attachment, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ids[id] = true
	if f.failAttach {
		return Attachment{}, errors.New("attach exploded")
	}
	return Attachment{ID: id, SandboxIP: netip.MustParseAddr("198.18.0.2")}, nil
}

func (f *fakeNet) Lookup(ctx context.Context, id string) (Attachment, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.ids[id] {
		return Attachment{}, errdefs.ErrNotFound
	}
	return Attachment{ID: id, SandboxIP: netip.MustParseAddr("198.18.0.2")}, nil
}

func (f *fakeNet) Detach(ctx context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.ids, id)
	return nil
}

func (f *fakeNet) List(ctx context.Context) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var ids []string
	for id := range f.ids {
		ids = append(ids, id)
	}
	return ids, nil
}

type fakeTemplates struct{}

func (fakeTemplates) Get(ctx context.Context, name string) (template.Template, error) {
	if name != "minimal" {
		return template.Template{}, fmt.Errorf("template %q: %w", name, errdefs.ErrNotFound)
	}
	return template.Template{Name: name, Built: true, Layers: []string{"/x"}}, nil
}

type fakeProber struct{ fail bool }

func (p fakeProber) WaitReady(ctx context.Context, addr string) error {
	if p.fail {
		return errdefs.ErrUnavailable
	}
	return nil
}

type fixture struct {
	m   *Manager
	rt  *fakeRuntime
	net *fakeNet
	db  *store.DB
}

func newFixture(t *testing.T, prober fakeProber) *fixture {
	t.Helper()
	db, err := store.Open(t.Context(), filepath.Join(t.TempDir(), "b.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	f := &fixture{rt: &fakeRuntime{running: map[string]runtime.Status{}}, net: &fakeNet{ids: map[string]bool{}}, db: db}
	f.m = f.manager(t, prober)
	return f
}

func (f *fixture) manager(t *testing.T, prober fakeProber) *Manager {
	t.Helper()
	m, err := New(Config{
		AgentPath: "/agent", DefaultTemplate: "minimal",
		Defaults: Limits{CPUMillis: 1000, MemoryBytes: 256 << 20, DiskBytes: 1 << 30, PidsLimit: 100},
		Max:      Limits{CPUMillis: 4000, MemoryBytes: 4 << 30, DiskBytes: 8 << 30, PidsLimit: 1000},
	}, Deps{Runtime: f.rt, Network: f.net, Templates: fakeTemplates{}, Store: f.db, Prober: prober})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	return m
}

func eventTypes(t *testing.T, m *Manager, id string) []string {
	t.Helper()
	evs, err := m.Events(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range evs {
		out = append(out, e.Type)
	}
	return out
}

func TestCreateDestroy(t *testing.T) {
	f := newFixture(t, fakeProber{})
	sb, err := f.m.Create(t.Context(), CreateRequest{Labels: map[string]string{"a": "b"}})
	if err != nil {
		t.Fatal(err)
	}
	if State(sb.State) != StateReady || len(sb.ID) != 20 || sb.MemoryBytes != 256<<20 {
		t.Errorf("Create = %+v", sb)
	}
	if _, _, err := f.m.Agent(t.Context(), sb.ID); err != nil {
		t.Errorf("Agent(ready) = %v", err)
	}
	list, _ := f.m.List(t.Context(), ListOptions{Labels: map[string]string{"a": "b"}})
	if len(list) != 1 {
		t.Errorf("List(a=b) = %d sandboxes, want 1", len(list))
	}
	if err := f.m.Destroy(t.Context(), sb.ID, "test"); err != nil {
		t.Fatal(err)
	}
	if err := f.m.Destroy(t.Context(), sb.ID, "again"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("second Destroy = %v, want not found", err)
	}
	got, _ := f.m.Get(t.Context(), sb.ID)
	if State(got.State) != StateStopped || got.Reason != "test" {
		t.Errorf("after Destroy: %+v", got)
	}
	if len(f.rt.running) != 0 || len(f.net.ids) != 0 {
		t.Errorf("leftovers: runtime %v, net %v", f.rt.running, f.net.ids)
	}
	if got := eventTypes(t, f.m, sb.ID); !slices.Equal(got, []string{"created", "ready", "destroyed"}) {
		t.Errorf("events = %v", got)
	}
}

func TestCreateFailuresLeaveNothing(t *testing.T) {
	for _, tc := range []struct {
		name   string
		failOn string
		prober fakeProber
	}{
		{"runtime", "create", fakeProber{}},
		{"agent never ready", "", fakeProber{fail: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, tc.prober)
			f.rt.failOn = tc.failOn
			f.m.cfg.ReadyTimeout = 50 * time.Millisecond
			sb, err := f.m.Create(t.Context(), CreateRequest{})
			if err == nil {
				t.Fatal("Create succeeded")
			}
			if State(sb.State) != StateFailed || sb.Reason == "" {
				t.Errorf("failed Create = %+v, want failed with reason", sb)
			}
			if len(f.rt.running) != 0 || len(f.net.ids) != 0 {
				t.Errorf("leftovers: runtime %v, net %v", f.rt.running, f.net.ids)
			}
		})
	}
}

func TestValidation(t *testing.T) {
	f := newFixture(t, fakeProber{})
	for _, tc := range []struct {
		req   CreateRequest
		field string
	}{
		{CreateRequest{Template: "nope"}, "template"},
		{CreateRequest{Limits: Limits{MemoryBytes: 1 << 10}}, "memory"},
		{CreateRequest{Limits: Limits{CPUMillis: 9000}}, "cpu"},
		{CreateRequest{Timeout: 48 * time.Hour}, "timeout"},
		{CreateRequest{Env: map[string]string{"1BAD": "x"}}, "env"},
		{CreateRequest{Env: map[string]string{"BERTH_AGENT_TOKEN": "chosen"}}, "env"},
		{CreateRequest{Env: map[string]string{"BERTH_AGENT_CRED_FD": "0"}}, "env"},
		{CreateRequest{Labels: map[string]string{"bad label": "x"}}, "labels"},
	} {
		_, err := f.m.Create(t.Context(), tc.req)
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != tc.field {
			t.Errorf("Create(%+v) = %v, want a %s field error", tc.req, err, tc.field)
		}
	}
	// Out-of-range messages give the allowed range in the field's units.
	for _, tc := range []struct {
		limits Limits
		want   string
	}{
		{Limits{CPUMillis: 50}, "cpu 0.05 is out of range: want 0.1 to 4"},
		{Limits{CPUMillis: 64000}, "cpu 64 is out of range: want 0.1 to 4"},
		{Limits{MemoryBytes: 1 << 10}, "memory 1KiB is out of range: want 16MiB to 4GiB"},
		{Limits{DiskBytes: 1000}, "disk 1000B is out of range: want 64MiB to 8GiB"},
	} {
		_, err := f.m.Create(t.Context(), CreateRequest{Limits: tc.limits})
		if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("Create(%+v) = %v, want invalid argument %q", tc.limits, err, tc.want)
		}
	}
	if all, _ := f.m.List(t.Context(), ListOptions{}); len(all) != 0 {
		t.Errorf("invalid requests left records: %+v", all)
	}
}

func TestReconcile(t *testing.T) {
	f := newFixture(t, fakeProber{})
	keep, _ := f.m.Create(t.Context(), CreateRequest{})
	dead, _ := f.m.Create(t.Context(), CreateRequest{})
	f.m.Close()
	// While the daemon is down: one sandbox's init dies, and an orphan
	// nobody recorded appears.
	f.rt.running[dead.ID] = runtime.StatusStopped
	f.rt.running["orphan"] = runtime.StatusRunning
	f.net.ids["orphan"] = true
	m2 := f.manager(t, fakeProber{})
	if got, _ := m2.Get(t.Context(), keep.ID); State(got.State) != StateReady {
		t.Errorf("running sandbox after restart: %s", got.State)
	}
	if got, _ := m2.Get(t.Context(), dead.ID); State(got.State) != StateFailed || got.Reason == "" {
		t.Errorf("dead sandbox after restart: %s %q", got.State, got.Reason)
	}
	if _, ok := f.rt.running["orphan"]; ok || f.net.ids["orphan"] {
		t.Error("orphan survived reconcile")
	}
	if _, ok := f.rt.running[dead.ID]; ok {
		t.Error("dead sandbox's runtime state survived reconcile")
	}
}
