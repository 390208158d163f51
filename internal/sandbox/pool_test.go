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

// updRuntime adds Update to fakeRuntime and records the limits.
type updRuntime struct {
	*fakeRuntime
	mu   sync.Mutex
	upds []runtime.Limits
}

func (r *updRuntime) Update(ctx context.Context, id string, l runtime.Limits) (uint64, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.upds = append(r.upds, l)
	return uint64(l.PidsLimit) + 1, nil
}

// waitWarm waits (on the bubble's clock) for the pool to hold n.
func waitWarm(t *testing.T, m *Manager, n int) {
	t.Helper()
	for range 1000 {
		if m.Warm()["minimal"].Ready == n {
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
		if _, err := m.SetWarm(t.Context(), "nosuch", 1); err == nil {
			t.Fatal("SetWarm of an unknown template succeeded")
		}
		if _, err := m.SetWarm(t.Context(), "minimal", MaxWarm+1); err == nil {
			t.Fatal("SetWarm above MaxWarm succeeded")
		}
		if _, err := m.SetWarm(t.Context(), "minimal", 1); err != nil {
			t.Fatal(err)
		}
		waitWarm(t, m, 1)
		if l, _ := m.List(t.Context(), ListOptions{}); len(l) != 0 {
			t.Fatalf("pooled sandbox listed: %+v", l)
		}
		var poolID string
		m.pool.mu.Lock()
		pooled := m.pool.ready["minimal"][0].c.e.rec
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
		waitWarm(t, m, 1)
		m.pool.mu.Lock()
		before := m.pool.ready["minimal"][0].c.e.id
		m.pool.mu.Unlock()
		if err := m.TemplateChanged(t.Context(), "minimal"); err != nil {
			t.Fatal(err)
		}
		if w := m.Warm()["minimal"]; w.Ready != 0 || w.Target != 1 {
			t.Errorf("after TemplateChanged: %+v, want drained", w)
		}
		waitWarm(t, m, 1)
		m.pool.mu.Lock()
		after := m.pool.ready["minimal"][0].c.e.id
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
