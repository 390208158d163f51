package sandbox

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"testing"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/core"
	"github.com/berth-sandbox/berth/internal/policy"
	"github.com/berth-sandbox/berth/internal/runtime"
)

// Fakes for the lifecycle tests, which run in testing/synctest bubbles:
// everything they block on is a channel made inside the bubble, so the
// bubble's clock advances only when the Manager waits on a timer. Unit
// tests only: the end-to-end suite runs the real backends.

// memStore is a Store in memory; failPut, when set, fails a write.
type memStore struct {
	mu      sync.Mutex
	sbs     map[string]core.Sandbox
	evs     []core.Event
	failPut func(core.Sandbox) error
}

func newMemStore() *memStore { return &memStore{sbs: map[string]core.Sandbox{}} }

func (s *memStore) PutSandbox(ctx context.Context, sb core.Sandbox) error {
	s.mu.Lock()
	failPut := s.failPut
	s.mu.Unlock()
	// Outside the lock: a hook may wait on the test.
	if failPut != nil {
		if err := failPut(sb); err != nil {
			return err
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sbs[sb.ID] = sb
	return nil
}

func (s *memStore) PutSandboxEvents(ctx context.Context, sb core.Sandbox, evs ...core.Event) ([]core.Event, error) {
	if err := s.PutSandbox(ctx, sb); err != nil {
		return nil, err
	}
	out := make([]core.Event, 0, len(evs))
	for _, e := range evs {
		e, _ = s.AddEvent(ctx, e)
		out = append(out, e)
	}
	return out, nil
}

func (s *memStore) GetSandbox(ctx context.Context, id string) (core.Sandbox, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sb, ok := s.sbs[id]
	if !ok {
		return core.Sandbox{}, errdefs.ErrNotFound
	}
	return sb, nil
}

func (s *memStore) ListSandboxes(ctx context.Context, states ...string) ([]core.Sandbox, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []core.Sandbox
	for _, sb := range s.sbs {
		if len(states) == 0 || slices.Contains(states, sb.State) {
			out = append(out, sb)
		}
	}
	slices.SortFunc(out, func(a, b core.Sandbox) int { return a.CreatedAt.Compare(b.CreatedAt) })
	return out, nil
}

func (s *memStore) AddEvent(ctx context.Context, e core.Event) (core.Event, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e.Seq = int64(len(s.evs) + 1)
	s.evs = append(s.evs, e)
	return e, nil
}

func (s *memStore) Events(ctx context.Context, id string, after int64) ([]core.Event, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []core.Event
	for _, e := range s.evs {
		if e.SandboxID == id && e.Seq > after {
			out = append(out, e)
		}
	}
	return out, nil
}

func (s *memStore) types(id string) []string {
	evs, _ := s.Events(context.Background(), id, 0)
	var out []string
	for _, e := range evs {
		out = append(out, e.Type)
	}
	return out
}

// fakeEgress records which sandboxes have egress state; failOn names the
// method that fails.
type fakeEgress struct {
	mu     sync.Mutex
	ids    map[string]policy.Policy
	failOn string
	// adopted is the CA pair AdoptCA set per sandbox.
	adopted map[string][2]string
}

func (f *fakeEgress) fail(op string) error {
	if f.failOn == op {
		return errors.New("egress " + op + " exploded")
	}
	return nil
}

func (f *fakeEgress) Prepare(id string) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	// A failed prepare may leave its half-made state (a CA key) behind.
	f.ids[id] = policy.Policy{}
	if p, ok := f.adopted[id]; ok {
		return []byte(p[0]), f.fail("prepare")
	}
	return []byte("ca"), f.fail("prepare")
}

// CA is the pair Prepare made ("ca", "key:"+id) or AdoptCA set.
func (f *fakeEgress) CA(id string) ([]byte, []byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.ids[id]; !ok {
		return nil, nil, errdefs.ErrNotFound
	}
	if p, ok := f.adopted[id]; ok {
		return []byte(p[0]), []byte(p[1]), nil
	}
	return []byte("ca"), []byte("key:" + id), nil
}

func (f *fakeEgress) AdoptCA(id string, cert, key []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.adopted == nil {
		f.adopted = map[string][2]string{}
	}
	f.adopted[id] = [2]string{string(cert), string(key)}
	return f.fail("adopt")
}

func (f *fakeEgress) Start(ctx context.Context, id string, hostIP netip.Addr, p policy.Policy) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ids[id] = p
	return f.fail("start")
}

func (f *fakeEgress) SetPolicy(id string, p policy.Policy) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ids[id] = p
	return nil
}

func (f *fakeEgress) Policy(id string) (policy.Policy, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p, ok := f.ids[id]
	if !ok {
		return policy.Policy{}, errdefs.ErrNotFound
	}
	return p, nil
}

func (f *fakeEgress) LoadPolicy(id string) (policy.Policy, error) { return f.Policy(id) }

func (f *fakeEgress) ResolvConf(hostIP netip.Addr) []byte {
	return []byte("nameserver " + hostIP.String() + "\n")
}

func (f *fakeEgress) Remove(id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.ids, id)
	return nil
}

// Stop keeps the state (the fake holds nothing else).
func (f *fakeEgress) Stop(id string) {}

func (f *fakeEgress) List() ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Collect(maps.Keys(f.ids)), nil
}

func (f *fakeEgress) Install(ctx context.Context, agentAddr, token string, gateway netip.Addr, ca []byte) error {
	return f.fail("install")
}

// statsRuntime adds usage to fakeRuntime; stats, when set, answers (and
// may block, to show how many samples run at once).
type statsRuntime struct {
	*fakeRuntime
	stats func(ctx context.Context, id string) (runtime.Stats, error)
}

func (r statsRuntime) Stats(ctx context.Context, id string) (runtime.Stats, error) {
	if r.stats == nil {
		return runtime.Stats{}, nil
	}
	return r.stats(ctx, id)
}

// lifeFixture is a Manager on fakes, made inside a synctest bubble.
type lifeFixture struct {
	m   *Manager
	rt  *fakeRuntime
	net *fakeNet
	st  *memStore
	eg  *fakeEgress
	fs  *fakeFiles
}

func newLifeFixture(t *testing.T, deps func(*Deps)) *lifeFixture {
	t.Helper()
	f := &lifeFixture{
		rt:  &fakeRuntime{running: map[string]runtime.Status{}},
		net: &fakeNet{ids: map[string]bool{}},
		st:  newMemStore(),
		eg:  &fakeEgress{ids: map[string]policy.Policy{}},
		fs:  &fakeFiles{files: map[string]string{}},
	}
	d := Deps{Runtime: f.rt, Network: f.net, Templates: fakeTemplates{}, Store: f.st, Prober: fakeProber{}, Egress: f.eg, Files: f.fs}
	if deps != nil {
		deps(&d)
	}
	m, err := New(Config{
		AgentPath: "/agent", DefaultTemplate: "minimal",
		Defaults: Limits{CPUMillis: 1000, MemoryBytes: 256 << 20, DiskBytes: 1 << 30, PidsLimit: 100},
		Max:      Limits{CPUMillis: 4000, MemoryBytes: 4 << 30, DiskBytes: 8 << 30, PidsLimit: 1000},
		Logger:   slog.New(slog.DiscardHandler),
	}, d)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	f.m = m
	return f
}

// assertNothingLeft fails if any fake still holds state for a sandbox or
// the Manager still tracks one.
func (f *lifeFixture) assertNothingLeft(t *testing.T) {
	t.Helper()
	f.rt.mu.Lock()
	rt := maps.Clone(f.rt.running)
	f.rt.mu.Unlock()
	f.net.mu.Lock()
	nt := maps.Clone(f.net.ids)
	f.net.mu.Unlock()
	f.eg.mu.Lock()
	eg := slices.Collect(maps.Keys(f.eg.ids))
	f.eg.mu.Unlock()
	f.m.mu.Lock()
	live := len(f.m.live)
	f.m.mu.Unlock()
	if len(rt) != 0 || len(nt) != 0 || len(eg) != 0 || live != 0 {
		t.Errorf("leftovers: runtime %v, network %v, egress %v, live entries %d", rt, nt, eg, live)
	}
}
