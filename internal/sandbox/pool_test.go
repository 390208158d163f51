package sandbox

import (
	"context"
	"maps"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/berth-sandbox/berth/internal/runtime"
)

// initFiles adds the agent's /init to fakeFiles and records each call.
type initFiles struct {
	*fakeFiles
	mu    sync.Mutex
	inits []initCall
}

type initCall struct {
	token, newToken, user string
	env                   map[string]string
	nproc                 uint64
}

func (f *initFiles) Init(ctx context.Context, addr, token string, env map[string]string, newToken, user string, nproc uint64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.inits = append(f.inits, initCall{token, newToken, user, maps.Clone(env), nproc})
	return nil
}

// updRuntime adds Update to fakeRuntime and records the limits, and
// which sandboxes it made without no_new_privs.
type updRuntime struct {
	*fakeRuntime
	mu     sync.Mutex
	upds   []runtime.Limits
	setuid map[string]bool
}

func (r *updRuntime) Create(ctx context.Context, spec runtime.Spec) error {
	r.mu.Lock()
	if r.setuid == nil {
		r.setuid = map[string]bool{}
	}
	r.setuid[spec.ID] = spec.AllowSetuid
	r.mu.Unlock()
	return r.fakeRuntime.Create(ctx, spec)
}

func (r *updRuntime) madeSetuid(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.setuid[id]
}

func (r *updRuntime) Update(ctx context.Context, id string, l runtime.Limits) (uint64, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.upds = append(r.upds, l)
	return uint64(l.PidsLimit) + 1, nil
}

var (
	plainMinimal = WarmKey{Template: "minimal"}
	sudoMinimal  = WarmKey{Template: "minimal", AllowSudo: true}
)

// waitWarm waits (on the bubble's clock) for the pool to hold n.
func waitWarm(t *testing.T, m *Manager, k WarmKey, n int) {
	t.Helper()
	for range 1000 {
		if m.Warm()[k].Ready == n {
			return
		}
		time.Sleep(10 * time.Millisecond) // fake clock: lets the refill timer fire
	}
	t.Fatalf("pool never held %d: %+v", n, m.Warm())
}

// A claim hands the pooled sandbox the request's limits, environment and
// a token of its own (the pool's token is what it presents, once), records
// it only then, and the pool refills; pooled sandboxes are in no listing,
// a template change drains them and a close removes them.
func TestWarmClaim(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		files := &initFiles{fakeFiles: &fakeFiles{files: map[string]string{}}}
		var rt *updRuntime
		f := newLifeFixture(t, func(d *Deps) {
			rt = &updRuntime{fakeRuntime: d.Runtime.(*fakeRuntime)}
			d.Runtime, d.Files = rt, files
		})
		m := f.m
		if _, err := m.SetWarm(t.Context(), WarmKey{Template: "nosuch"}, 1); err == nil {
			t.Fatal("SetWarm of an unknown template succeeded")
		}
		if _, err := m.SetWarm(t.Context(), plainMinimal, MaxWarm+1); err == nil {
			t.Fatal("SetWarm above MaxWarm succeeded")
		}
		if _, err := m.SetWarm(t.Context(), plainMinimal, 1); err != nil {
			t.Fatal(err)
		}
		waitWarm(t, m, plainMinimal, 1)
		if l, _ := m.List(t.Context(), ListOptions{}); len(l) != 0 {
			t.Fatalf("pooled sandbox listed: %+v", l)
		}
		var poolID string
		m.pool.mu.Lock()
		pooled := m.pool.ready[plainMinimal][0].c.e.rec
		m.pool.mu.Unlock()
		poolID = pooled.ID

		sb, err := m.Create(t.Context(), CreateRequest{Template: "minimal", Env: map[string]string{"FOO": "bar"}, Labels: map[string]string{"l": "v"}, Owner: "key1", Limits: Limits{PidsLimit: 50}})
		if err != nil {
			t.Fatal(err)
		}
		if sb.ID != poolID || sb.State != string(StateReady) || sb.Owner != "key1" || sb.PidsLimit != 50 || sb.Labels["l"] != "v" {
			t.Fatalf("claimed %+v, want pooled %s with the request's fields", sb.Sandbox, poolID)
		}
		if len(files.inits) != 1 {
			t.Fatalf("inits = %+v, want one", files.inits)
		}
		in := files.inits[0]
		if in.token != pooled.Token || in.newToken != sb.Token || sb.Token == pooled.Token || in.env["FOO"] != "bar" || in.nproc != 51 {
			t.Errorf("init %+v: want pool token %s replaced by %s, env FOO, nproc 51", in, pooled.Token, sb.Token)
		}
		if len(rt.upds) != 1 || rt.upds[0].PidsLimit != 50 || rt.upds[0].MemoryBytes != 256<<20 {
			t.Errorf("updates = %+v", rt.upds)
		}
		if ty := f.st.types(sb.ID); strings.Join(ty, ",") != "created,ready" {
			t.Errorf("events = %v", ty)
		}
		// The pool refills behind the claim; a template change drains
		// it and it refills with a new sandbox.
		waitWarm(t, m, plainMinimal, 1)
		m.pool.mu.Lock()
		before := m.pool.ready[plainMinimal][0].c.e.id
		m.pool.mu.Unlock()
		if err := m.TemplateChanged(t.Context(), "minimal"); err != nil {
			t.Fatal(err)
		}
		if w := m.Warm()[plainMinimal]; w.Ready != 0 || w.Target != 1 {
			t.Errorf("after TemplateChanged: %+v, want drained", w)
		}
		waitWarm(t, m, plainMinimal, 1)
		m.pool.mu.Lock()
		after := m.pool.ready[plainMinimal][0].c.e.id
		m.pool.mu.Unlock()
		if after == before {
			t.Error("the pool kept its sandbox across a template change")
		}
		if err := m.Destroy(t.Context(), sb.ID, "test"); err != nil {
			t.Fatal(err)
		}
		m.Close()
		f.assertNothingLeft(t)
	})
}

// Claims match allow_sudo exactly: a create that asks for it takes only
// a sandbox of the sudo-capable pool (made without no_new_privs), and a
// create that does not never gets one; either misses goes cold and
// leaves the other pool as it was. A template change drains both.
func TestWarmClaimSudo(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		files := &initFiles{fakeFiles: &fakeFiles{files: map[string]string{}}}
		var rt *updRuntime
		f := newLifeFixture(t, func(d *Deps) {
			rt = &updRuntime{fakeRuntime: d.Runtime.(*fakeRuntime)}
			d.Runtime, d.Files = rt, files
		})
		m := f.m
		if _, err := m.SetWarm(t.Context(), sudoMinimal, 1); err != nil {
			t.Fatal(err)
		}
		waitWarm(t, m, sudoMinimal, 1)
		if w := m.Warm(); len(w) != 1 || w[sudoMinimal] != (WarmStatus{Target: 1, Ready: 1}) {
			t.Fatalf("Warm() = %+v, want only the sudo pool", w)
		}
		m.pool.mu.Lock()
		sudoID := m.pool.ready[sudoMinimal][0].c.e.id
		m.pool.mu.Unlock()
		if !rt.madeSetuid(sudoID) {
			t.Fatal("the sudo pool's sandbox was made with no_new_privs")
		}

		// Without allow_sudo: cold, and the sudo pool keeps its one.
		plain, err := m.Create(t.Context(), CreateRequest{Template: "minimal"})
		if err != nil {
			t.Fatal(err)
		}
		if plain.ID == sudoID || plain.AllowSudo || rt.madeSetuid(plain.ID) {
			t.Fatalf("a create without allow_sudo got %+v (setuid %v), want a cold one with no_new_privs", plain.Sandbox, rt.madeSetuid(plain.ID))
		}
		if w := m.Warm()[sudoMinimal]; w.Ready != 1 {
			t.Fatalf("sudo pool after a plain create: %+v, want its one kept", w)
		}
		if len(files.inits) != 0 {
			t.Fatalf("inits = %+v: a pooled sandbox was claimed", files.inits)
		}

		// With allow_sudo: the pooled one.
		sudo, err := m.Create(t.Context(), CreateRequest{Template: "minimal", AllowSudo: new(true)})
		if err != nil {
			t.Fatal(err)
		}
		if sudo.ID != sudoID || !sudo.AllowSudo {
			t.Fatalf("a create with allow_sudo got %+v, want pooled %s", sudo.Sandbox, sudoID)
		}
		waitWarm(t, m, sudoMinimal, 1)

		// The other way round: only a plain pool; an allow_sudo create
		// goes cold and leaves it be.
		if _, err := m.SetWarm(t.Context(), sudoMinimal, 0); err != nil {
			t.Fatal(err)
		}
		if _, err := m.SetWarm(t.Context(), plainMinimal, 1); err != nil {
			t.Fatal(err)
		}
		waitWarm(t, m, plainMinimal, 1)
		if _, ok := m.Warm()[sudoMinimal]; ok {
			t.Fatalf("Warm() = %+v, want the sudo pool dropped", m.Warm())
		}
		m.pool.mu.Lock()
		plainID := m.pool.ready[plainMinimal][0].c.e.id
		m.pool.mu.Unlock()
		if rt.madeSetuid(plainID) {
			t.Fatal("the plain pool's sandbox was made without no_new_privs")
		}
		cold, err := m.Create(t.Context(), CreateRequest{Template: "minimal", AllowSudo: new(true)})
		if err != nil {
			t.Fatal(err)
		}
		if cold.ID == plainID || !cold.AllowSudo || !rt.madeSetuid(cold.ID) {
			t.Fatalf("an allow_sudo create got %+v, want a cold one without no_new_privs", cold.Sandbox)
		}
		if w := m.Warm()[plainMinimal]; w.Ready != 1 {
			t.Fatalf("plain pool after an allow_sudo create: %+v, want its one kept", w)
		}

		// Both pools at once; a template change drains both.
		if _, err := m.SetWarm(t.Context(), sudoMinimal, 1); err != nil {
			t.Fatal(err)
		}
		waitWarm(t, m, sudoMinimal, 1)
		if err := m.TemplateChanged(t.Context(), "minimal"); err != nil {
			t.Fatal(err)
		}
		if w := m.Warm(); w[plainMinimal].Ready != 0 || w[sudoMinimal].Ready != 0 {
			t.Errorf("after TemplateChanged: %+v, want both drained", w)
		}
		for _, id := range []string{plain.ID, sudo.ID, cold.ID} {
			if err := m.Destroy(t.Context(), id, "test"); err != nil {
				t.Fatal(err)
			}
		}
		m.Close()
		f.assertNothingLeft(t)
	})
}
