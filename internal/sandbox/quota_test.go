package sandbox

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/core"
)

// fakeKeys is a key store of quotas a test sets; err, when set, is what
// every lookup fails with.
type fakeKeys struct {
	mu     sync.Mutex
	quotas map[string]core.Quota
	err    error
}

func (k *fakeKeys) GetAPIKey(ctx context.Context, id string) (core.APIKey, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.err != nil {
		return core.APIKey{}, k.err
	}
	q, ok := k.quotas[id]
	if !ok {
		return core.APIKey{}, errdefs.ErrNotFound
	}
	return core.APIKey{ID: id, Quota: q}, nil
}

func (k *fakeKeys) set(id string, q core.Quota) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.quotas[id] = q
}

// newQuotaFixture is a pauseFixture over a checkpointing runtime whose
// Manager reads owners' quotas from keys.
func newQuotaFixture(t *testing.T) (*pauseFixture, *cpRuntime, *fakeKeys) {
	t.Helper()
	rt := newCPRuntime()
	keys := &fakeKeys{quotas: map[string]core.Quota{}}
	f := newPauseFixture(t, rt)
	f.m.Close()
	f.deps.Keys = keys
	f.start(t)
	return f, rt, keys
}

// TestQuotaLeavesPausedOut: a key's paused sandboxes do not count against
// its CPU and memory bounds, so creates fit beside them, while they keep
// their places under max-sandboxes; a resume is admitted against the CPU
// and memory bounds the key store has then and refused
// (resource_exhausted, naming the quota) without touching the runtime,
// the sandbox staying paused.
func TestQuotaLeavesPausedOut(t *testing.T) {
	f, rt, keys := newQuotaFixture(t)
	ctx := t.Context()
	q := core.Quota{MaxSandboxes: 3, MaxMemoryBytes: 256 << 20, MaxCPUMillis: 2000}
	keys.set("k1", q)
	req := CreateRequest{Owner: "k1", Quota: q, Limits: Limits{MemoryBytes: 256 << 20, CPUMillis: 1000}}
	a, err := f.m.Create(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.m.Create(ctx, req); !errors.Is(err, errdefs.ErrResourceExhausted) || !strings.Contains(err.Error(), "max-memory") {
		t.Fatalf("second create of 256M under max-memory 256M: %v, want resource_exhausted naming max-memory", err)
	}
	if _, err := f.m.Pause(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	b, err := f.m.Create(ctx, req)
	if err != nil {
		t.Fatalf("create beside a paused sandbox: %v", err)
	}
	restores := rt.restores
	_, err = f.m.Resume(ctx, a.ID, 0)
	if !errors.Is(err, errdefs.ErrResourceExhausted) || !strings.Contains(err.Error(), "max-memory") || !strings.Contains(err.Error(), "k1") {
		t.Fatalf("resume past the quota: %v, want resource_exhausted naming the key and max-memory", err)
	}
	if got, _ := f.m.Get(ctx, a.ID); State(got.State) != StatePaused || rt.restores != restores {
		t.Fatalf("after the refused resume: %s, %d restores; want paused, none", got.State, rt.restores-restores)
	}
	// Paused ones keep their places under max-sandboxes: with a and b
	// paused, a third is made, a fourth is not.
	if _, err := f.m.Pause(ctx, b.ID); err != nil {
		t.Fatal(err)
	}
	c, err := f.m.Create(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.m.Pause(ctx, c.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := f.m.Create(ctx, req); !errors.Is(err, errdefs.ErrResourceExhausted) || !strings.Contains(err.Error(), "max-sandboxes 3") {
		t.Fatalf("fourth create with three paused under max-sandboxes 3: %v, want resource_exhausted naming max-sandboxes", err)
	}
	// A resume is not a new place: at max-sandboxes it goes through.
	if _, err := f.m.Resume(ctx, a.ID, 0); err != nil {
		t.Fatalf("resume with every place taken by the key's own: %v", err)
	}
	// The key store's quota now, not the one at create: the CPU bound
	// lowered, b's resume does not fit beside a; lifted, it does.
	keys.set("k1", core.Quota{MaxCPUMillis: 1500})
	if _, err := f.m.Resume(ctx, b.ID, 0); !errors.Is(err, errdefs.ErrResourceExhausted) || !strings.Contains(err.Error(), "max-cpu") {
		t.Fatalf("resume past max-cpu: %v, want resource_exhausted naming max-cpu", err)
	}
	keys.set("k1", core.Quota{})
	if _, err := f.m.Resume(ctx, b.ID, 0); err != nil {
		t.Fatalf("resume of an unbounded key: %v", err)
	}
	// Another owner's sandboxes are not counted; an unknown key bounds
	// nothing.
	keys.set("k1", core.Quota{MaxMemoryBytes: 512 << 20})
	if _, err := f.m.Create(ctx, CreateRequest{Owner: "k2", Quota: core.Quota{MaxMemoryBytes: 256 << 20}, Limits: Limits{MemoryBytes: 256 << 20}}); err != nil {
		t.Fatalf("another key's create: %v", err)
	}
	if _, err := f.m.Resume(ctx, c.ID, 0); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("resume of k1's third with 512M running under max-memory 512M: %v", err)
	}
	keys.mu.Lock()
	delete(keys.quotas, "k1")
	keys.mu.Unlock()
	if _, err := f.m.Resume(ctx, c.ID, 0); err != nil {
		t.Fatalf("resume of a key the store does not know: %v", err)
	}
}

// TestQuotaResumeStoreError: a key store that cannot answer fails the
// resume with its error; the sandbox stays paused.
func TestQuotaResumeStoreError(t *testing.T) {
	f, _, keys := newQuotaFixture(t)
	ctx := t.Context()
	sb, err := f.m.Create(ctx, CreateRequest{Owner: "k1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.m.Pause(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	keys.err = errors.New("database is locked")
	if _, err := f.m.Resume(ctx, sb.ID, 0); err == nil || !strings.Contains(err.Error(), "database is locked") {
		t.Fatalf("resume with the key store failing: %v, want its error", err)
	}
	if got, _ := f.m.Get(ctx, sb.ID); State(got.State) != StatePaused {
		t.Fatalf("after the failed resume: %s, want paused", got.State)
	}
	keys.err = nil
	if _, err := f.m.Resume(ctx, sb.ID, 0); err != nil {
		t.Fatal(err)
	}
}

// TestQuotaConcurrentResumes: a resume holds its memory from its
// admission on, while its record is written and while the runtime
// restores: a second resume, or a create, for the last of the key's
// memory is refused meanwhile, and gets it once the first is paused
// again.
func TestQuotaConcurrentResumes(t *testing.T) {
	f, rt, keys := newQuotaFixture(t)
	ctx := t.Context()
	q := core.Quota{MaxMemoryBytes: 256 << 20}
	keys.set("k1", q)
	req := CreateRequest{Owner: "k1", Quota: q, Limits: Limits{MemoryBytes: 256 << 20}}
	var ids []string
	for range 2 {
		// One at a time: each is paused before the next is made.
		sb, err := f.m.Create(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.m.Pause(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, sb.ID)
	}
	// Held first where its record is being written (admitted, its state
	// not yet published), then where the runtime restores it.
	for _, hold := range []string{"store", "runtime"} {
		entered, release := make(chan struct{}), make(chan struct{})
		gate := func() {
			entered <- struct{}{}
			<-release
		}
		if hold == "store" {
			f.st.mu.Lock()
			f.st.failPut = func(sb core.Sandbox) error {
				if sb.ID == ids[0] && State(sb.State) == StateResuming {
					gate()
				}
				return nil
			}
			f.st.mu.Unlock()
		} else {
			rt.onRestore = gate
		}
		first := make(chan error, 1)
		go func() {
			_, err := f.m.Resume(ctx, ids[0], 0)
			first <- err
		}()
		select {
		case <-entered:
		case err := <-first:
			t.Fatalf("held in the %s: the first resume ended before it was held: %v", hold, err)
		}
		if _, err := f.m.Resume(ctx, ids[1], 0); !errors.Is(err, errdefs.ErrResourceExhausted) {
			t.Errorf("held in the %s: second resume: %v, want resource_exhausted", hold, err)
		}
		if _, err := f.m.Create(ctx, req); !errors.Is(err, errdefs.ErrResourceExhausted) {
			t.Errorf("held in the %s: create: %v, want resource_exhausted", hold, err)
		}
		close(release)
		if err := <-first; err != nil {
			t.Fatal(err)
		}
		f.st.mu.Lock()
		f.st.failPut = nil
		f.st.mu.Unlock()
		rt.onRestore = nil
		if hold == "store" {
			if _, err := f.m.Pause(ctx, ids[0]); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := f.m.Resume(ctx, ids[1], 0); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Errorf("second resume while the first runs: %v, want resource_exhausted", err)
	}
	if _, err := f.m.Pause(ctx, ids[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := f.m.Resume(ctx, ids[1], 0); err != nil {
		t.Errorf("second resume once the first is paused again: %v", err)
	}
}
