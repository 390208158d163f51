package sandbox

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/policy"
	"github.com/berth-sandbox/berth/internal/runtime"
	"github.com/berth-sandbox/berth/internal/store"
)

// layerRuntime is the fake runtime that also records each spec's layers.
type layerRuntime struct {
	*fakeRuntime
	mu     sync.Mutex
	layers map[string][]string
}

func (r *layerRuntime) Create(ctx context.Context, spec runtime.Spec) error {
	r.mu.Lock()
	r.layers[spec.ID] = spec.Layers
	r.mu.Unlock()
	return r.fakeRuntime.Create(ctx, spec)
}

func newSetupManager(t *testing.T) (*Manager, *layerRuntime) {
	t.Helper()
	db, err := store.Open(t.Context(), filepath.Join(t.TempDir(), "b.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	rt := &layerRuntime{fakeRuntime: &fakeRuntime{running: map[string]runtime.Status{}}, layers: map[string][]string{}}
	m, err := New(Config{AgentPath: "/agent", DefaultTemplate: "minimal",
		Defaults: Limits{CPUMillis: 1000, MemoryBytes: 256 << 20, DiskBytes: 1 << 30, PidsLimit: 100}},
		Deps{Runtime: rt, Network: &fakeNet{ids: map[string]bool{}}, Templates: fakeTemplates{}, Store: db, Prober: fakeProber{}})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	return m, rt
}

func TestSetupHook(t *testing.T) {
	m, rt := newSetupManager(t)
	before := time.Now()
	var seen string
	sb, err := m.Create(t.Context(), CreateRequest{Timeout: time.Hour, Layers: []string{"/cached"},
		Setup: func(ctx context.Context, h *SetupHandle) error {
			seen = h.ID()
			if h.Template() != "minimal" {
				t.Errorf("Template() = %q", h.Template())
			}
			if addr, token := h.Agent(); addr != "198.18.0.2:49983" || token == "" {
				t.Errorf("Agent() = %q, %q", addr, token)
			}
			if d := h.Deadline(); d.Before(before.Add(time.Hour)) {
				t.Errorf("Deadline() = %v, want an hour from the create", d)
			}
			// While setup runs the sandbox is still creating.
			if got, err := m.Get(ctx, h.ID()); err != nil || State(got.State) != StateCreating {
				t.Errorf("Get during setup = %s, %v; want creating", got.State, err)
			}
			h.Event(ctx, "setup_done", "all set")
			// This daemon has no egress services: mode none is fine,
			// anything else is refused, and a bad policy names its field.
			if err := h.SetPolicy(ctx, policy.Policy{Mode: policy.ModeNone}); err != nil {
				t.Errorf("SetPolicy(none) = %v", err)
			}
			if err := h.SetPolicy(ctx, policy.Policy{Mode: policy.ModeOpen}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
				t.Errorf("SetPolicy(open) without egress = %v, want failed precondition", err)
			}
			var fe *FieldError
			if err := h.SetPolicy(ctx, policy.Policy{Mode: "bogus"}); !errors.As(err, &fe) {
				t.Errorf("SetPolicy(bogus) = %v, want a field error", err)
			}
			if h.CanPause() {
				t.Error("CanPause() on a runtime without pause")
			}
			if err := h.Pause(ctx); !errors.Is(err, errdefs.ErrFailedPrecondition) {
				t.Errorf("Pause() = %v, want failed precondition", err)
			}
			return nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	if sb.ID != seen || State(sb.State) != StateReady {
		t.Errorf("Create = %s %s, setup saw %s", sb.ID, sb.State, seen)
	}
	rt.mu.Lock()
	layers := rt.layers[sb.ID]
	rt.mu.Unlock()
	if !slices.Equal(layers, []string{"/cached"}) {
		t.Errorf("layers = %v, want the request's", layers)
	}
	if got, want := eventTypes(t, m, sb.ID), []string{EventCreated, "setup_done", EventReady}; !slices.Equal(got, want) {
		t.Errorf("events = %v, want %v", got, want)
	}
}

func TestSetupFailureFailsCreate(t *testing.T) {
	m, rt := newSetupManager(t)
	sb, err := m.Create(t.Context(), CreateRequest{Setup: func(ctx context.Context, h *SetupHandle) error {
		return errors.New("step 2 exited with code 1")
	}})
	if err == nil {
		t.Fatal("create with a failing setup succeeded")
	}
	if State(sb.State) != StateFailed || !strings.Contains(sb.Reason, "setup: step 2 exited with code 1") {
		t.Errorf("sandbox = %s %q, want failed naming the setup error", sb.State, sb.Reason)
	}
	if ids, _ := rt.List(t.Context()); len(ids) != 0 {
		t.Errorf("runtime still holds %v after a failed setup", ids)
	}
}
