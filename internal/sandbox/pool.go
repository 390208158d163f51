package sandbox

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/core"
	"github.com/berth-sandbox/berth/internal/policy"
	"github.com/berth-sandbox/berth/internal/runtime"
	"github.com/berth-sandbox/berth/internal/template"
)

// Warm pools: per template, a few sandboxes made ahead of time with the
// daemon's default limits, no request environment and egress mode none
// (and with no_new_privs, or for a sudo-capable pool without, as
// allow_sudo makes them),
// and kept out of m.live and the store, so no listing, quota, usage meter
// or monitor sees them (they do use the host's memory, cpu and uid
// ranges like any sandbox). A create that names a pooled template and
// asks for nothing that cannot be applied to a running sandbox (its own
// layers, a setup hook, another disk size) claims one from the pool of its
// allow_sudo: its limits are set
// in the cgroup, its agent is handed the request's environment, default
// user and a fresh token (the pool's token stops working), its egress
// policy is applied, and only then is it recorded and published, with the
// creation time, deadline, owner and labels of the request.
//
// A pooled sandbox's entry holds its op lock from fill to claim. Nothing
// about it is persisted: after a daemon crash reconcile finds its runtime
// container, network and egress state owned by no record and removes them.

// Updater is the optional ability to change a running sandbox's limits
// (runc). errdefs.ErrNotImplemented means it cannot; a claim then needs
// the pool's limits exactly. A non-zero nproc is an RLIMIT_NPROC the
// runtime could not set from outside, for the sandbox's agent to lower
// its own to (see runc.Runtime.Update).
type Updater interface {
	Update(ctx context.Context, id string, l runtime.Limits) (nproc uint64, err error)
}

// AgentIniter hands a running agent a new identity (agentlink.Link.Init):
// env is set in its sandbox-wide environment, newToken replaces token,
// user ("": unchanged) becomes its default user, and a non-zero nproc
// lowers its RLIMIT_NPROC.
type AgentIniter interface {
	Init(ctx context.Context, addr, token string, env map[string]string, newToken, user string, nproc uint64) error
}

// MaxWarm bounds one pool.
const MaxWarm = 64

// WarmKey names a pool: a template, and whether its sandboxes are made
// with allow_sudo (no no_new_privs). A claim takes only from the pool of
// its own request's allow_sudo: a sudo-capable sandbox never goes to a
// create that did not ask for one, nor the other way round.
type WarmKey struct {
	Template  string
	AllowSudo bool
}

func (k WarmKey) compare(o WarmKey) int {
	if c := strings.Compare(k.Template, o.Template); c != 0 {
		return c
	}
	switch {
	case k.AllowSudo == o.AllowSudo:
		return 0
	case o.AllowSudo:
		return -1
	}
	return 1
}

// WarmStatus is one template's pool: how many sandboxes it should hold and
// how many are ready to be claimed.
type WarmStatus struct {
	Target int
	Ready  int
}

// warm is a pooled sandbox: its creation, finished up to ready.
type warm struct {
	c   *creation
	iso string
	gen int
}

// pool is the Manager's warm pools.
type pool struct {
	mu      sync.Mutex
	targets map[WarmKey]int
	ready   map[WarmKey][]*warm
	// gen counts drains per pool: a fill that started before one is
	// discarded when it ends.
	gen map[WarmKey]int
	// filling is the pool a fill is running for (zero: none) and done
	// is closed when it ends.
	filling WarmKey
	done    chan struct{}
	// creates is the creates in flight: the refill waits for none, and
	// lastCreate is when the last one ended.
	creates    int
	lastCreate time.Time
	// retryAt holds pools whose last fill failed until then.
	retryAt map[WarmKey]time.Time
	backoff map[WarmKey]time.Duration
	wake    chan struct{}
}

func newPool(targets map[WarmKey]int) *pool {
	p := &pool{
		targets: map[WarmKey]int{},
		ready:   map[WarmKey][]*warm{},
		gen:     map[WarmKey]int{},
		retryAt: map[WarmKey]time.Time{},
		backoff: map[WarmKey]time.Duration{},
		wake:    make(chan struct{}, 1),
	}
	for k, v := range targets {
		if v > 0 {
			p.targets[k] = v
		}
	}
	return p
}

func (p *pool) poke() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// createStarted and createDone bracket a live create: the refill yields
// to them.
func (p *pool) createStarted() {
	p.mu.Lock()
	p.creates++
	p.mu.Unlock()
}

func (p *pool) createDone() {
	p.mu.Lock()
	p.creates--
	p.lastCreate = time.Now()
	p.mu.Unlock()
	p.poke()
}

// next picks the pool to fill now (zero for none) and marks it filling.
func (p *pool) next(now time.Time) (name WarmKey, gen int, retry time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.creates > 0 || p.filling != (WarmKey{}) {
		return WarmKey{}, 0, 0
	}
	for _, n := range slices.SortedFunc(maps.Keys(p.targets), WarmKey.compare) {
		if len(p.ready[n]) >= p.targets[n] {
			continue
		}
		if at, ok := p.retryAt[n]; ok && now.Before(at) {
			if d := at.Sub(now); retry == 0 || d < retry {
				retry = d
			}
			continue
		}
		p.filling, p.done = n, make(chan struct{})
		return n, p.gen[n], 0
	}
	return WarmKey{}, 0, retry
}

// refillSettle is how long the refill waits after the last create before
// it starts a fill: a sandbox just created is usually sent its first
// commands at once, and a fill (a runc create, CPU-heavy) would compete
// with them on a small host.
const refillSettle = 100 * time.Millisecond

// settle waits refillSettle, and reports whether a create started
// meanwhile.
func (p *pool) settle(ctx context.Context) bool {
	t := time.NewTimer(refillSettle)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return true
	case <-t.C:
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.creates > 0 || time.Since(p.lastCreate) < refillSettle
}

// unfill undoes next's mark when the fill does not start.
func (p *pool) unfill(name WarmKey) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.filling == name {
		p.filling = WarmKey{}
		close(p.done)
	}
}

// filled ends a fill: it returns w to the caller to discard when the pool
// no longer wants it (drained meanwhile, or above target).
func (p *pool) filled(name WarmKey, w *warm, err error) (discard *warm) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.filling = WarmKey{}
	close(p.done)
	if err != nil {
		b := max(p.backoff[name]*2, time.Second)
		p.backoff[name] = min(b, time.Minute)
		p.retryAt[name] = time.Now().Add(p.backoff[name])
		return nil
	}
	delete(p.backoff, name)
	delete(p.retryAt, name)
	if w.gen != p.gen[name] || len(p.ready[name]) >= p.targets[name] {
		return w
	}
	p.ready[name] = append(p.ready[name], w)
	return nil
}

// take removes a pooled sandbox of the pool at level iso.
func (p *pool) take(name WarmKey, iso string) *warm {
	p.mu.Lock()
	defer p.mu.Unlock()
	ws := p.ready[name]
	for i, w := range ws {
		if w.iso == iso {
			p.ready[name] = slices.Delete(ws, i, i+1)
			return w
		}
	}
	return nil
}

// giveBack returns an untouched pooled sandbox (a claim that could not
// use it), unless the pool was drained meanwhile.
func (p *pool) giveBack(name WarmKey, w *warm) (discard *warm) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if w.gen != p.gen[name] || len(p.ready[name]) >= p.targets[name] {
		return w
	}
	p.ready[name] = append(p.ready[name], w)
	return nil
}

// drain takes every pooled sandbox of the template, sudo-capable or not
// (all templates for ""), so a fill under way is discarded, and returns
// them with the channel of that fill (nil: none).
func (p *pool) drain(name string) ([]*warm, chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []*warm
	for n, ws := range p.ready {
		if name == "" || n.Template == name {
			out = append(out, ws...)
			delete(p.ready, n)
			p.gen[n]++
		}
	}
	if name != "" {
		// also when they held none yet
		p.gen[WarmKey{Template: name}]++
		p.gen[WarmKey{Template: name, AllowSudo: true}]++
	}
	var done chan struct{}
	if p.filling != (WarmKey{}) && (name == "" || p.filling.Template == name) {
		done = p.done
	}
	return out, done
}

// SetWarm sets how many ready sandboxes a pool keeps (0 drops the pool).
// The template must exist.
func (m *Manager) SetWarm(ctx context.Context, name WarmKey, n int) (WarmStatus, error) {
	if n < 0 || n > MaxWarm {
		return WarmStatus{}, &FieldError{Field: "target", Err: fmt.Errorf("target %d is out of range [0, %d]: %w", n, MaxWarm, errdefs.ErrInvalidArgument)}
	}
	if _, err := m.deps.Templates.Get(ctx, name.Template); err != nil {
		return WarmStatus{}, err
	}
	p := m.pool
	p.mu.Lock()
	if n == 0 {
		delete(p.targets, name)
	} else {
		p.targets[name] = n
	}
	delete(p.retryAt, name)
	delete(p.backoff, name)
	var extra []*warm
	if ws := p.ready[name]; len(ws) > n {
		extra = slices.Clone(ws[n:])
		p.ready[name] = ws[:n]
	}
	st := WarmStatus{Target: n, Ready: len(p.ready[name])}
	p.mu.Unlock()
	m.discard(extra...)
	p.poke()
	m.log.Info("warm_pool_target", "template", name.Template, "allow_sudo", name.AllowSudo, "target", n)
	return st, nil
}

// Warm reports every pool that has a target or holds sandboxes.
func (m *Manager) Warm() map[WarmKey]WarmStatus {
	p := m.pool
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[WarmKey]WarmStatus{}
	for n, t := range p.targets {
		out[n] = WarmStatus{Target: t, Ready: len(p.ready[n])}
	}
	for n, ws := range p.ready {
		if len(ws) > 0 {
			s := out[n]
			s.Ready = len(ws)
			out[n] = s
		}
	}
	return out
}

// TemplateChanged drains a template's pool (its sandboxes stand on the
// old build, or the old isolation level) and waits for a fill under way
// to end, so a removal of its layers finds none in use; the pool then
// refills from the template as it is now.
func (m *Manager) TemplateChanged(ctx context.Context, name string) error {
	ws, done := m.pool.drain(name)
	if done != nil {
		select {
		case <-done:
		case <-ctx.Done():
			return ctx.Err()
		}
		// The fill that ended is discarded by its generation; take
		// anything that slipped in regardless.
		more, _ := m.pool.drain(name)
		ws = append(ws, more...)
	}
	m.discard(ws...)
	m.pool.mu.Lock()
	for _, k := range []WarmKey{{Template: name}, {Template: name, AllowSudo: true}} {
		delete(m.pool.retryAt, k)
		delete(m.pool.backoff, k)
	}
	m.pool.mu.Unlock()
	m.pool.poke()
	if len(ws) > 0 {
		m.log.Info("warm_pool_drained", "template", name, "sandboxes", len(ws))
	}
	return nil
}

// discard destroys pooled sandboxes.
func (m *Manager) discard(ws ...*warm) {
	for _, w := range ws {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		if err := w.c.undo.unwind(ctx); err != nil {
			m.log.Error("warm_pool_discard", "sandbox_id", w.c.e.id, "err", err)
		}
		cancel()
	}
}

// refill keeps the pools at their targets until the Manager closes: one
// sandbox at a time, and only while no live create is under way.
func (m *Manager) refill() {
	for m.life.Err() == nil {
		name, gen, retry := m.pool.next(time.Now())
		if name != (WarmKey{}) && m.pool.settle(m.life) {
			// A create came in while we waited: yield to it.
			m.pool.unfill(name)
			continue
		}
		if name == (WarmKey{}) {
			var timer <-chan time.Time
			if retry > 0 {
				timer = time.After(retry)
			}
			select {
			case <-m.life.Done():
				return
			case <-m.pool.wake:
			case <-timer:
			}
			continue
		}
		w, err := m.fill(m.life, name, gen)
		if err != nil && m.life.Err() == nil {
			m.log.Warn("warm_pool_fill", "template", name.Template, "allow_sudo", name.AllowSudo, "err", err)
		}
		if d := m.pool.filled(name, w, err); d != nil {
			m.discard(d)
		}
	}
}

// poolRequest is the request a pooled sandbox is made with: the defaults
// of everything but the pids limit, which is the highest a request may
// ask for. A claim lowers it to the request's: the RLIMIT_NPROC that
// backs it (runc's Update) can only be raised with CAP_SYS_RESOURCE,
// which a daemon in a container may lack. Until claimed the sandbox runs
// nothing but its agent.
// Under gVisor, whose limits cannot change (runc.Runtime.Update), the
// pool has the defaults, which a request for the defaults matches.
// A sudo-capable pool's sandboxes are made with allow_sudo.
func (m *Manager) poolRequest(name WarmKey, iso string) (CreateRequest, error) {
	req := CreateRequest{Template: name.Template, AllowSudo: new(name.AllowSudo)}
	if m.cfg.Max.PidsLimit > 0 && iso != core.IsolationGVisor {
		req.Limits.PidsLimit = m.cfg.Max.PidsLimit
	}
	return req, m.validate(&req)
}

// fill makes one pooled sandbox of the pool.
func (m *Manager) fill(ctx context.Context, name WarmKey, gen int) (*warm, error) {
	tpl, err := m.deps.Templates.Get(ctx, name.Template)
	if err != nil {
		return nil, err
	}
	iso, err := m.resolveIsolation("", tpl.Isolation)
	if err != nil {
		return nil, err
	}
	req, err := m.poolRequest(name, iso)
	if err != nil {
		return nil, err
	}
	now := time.Now().UTC()
	rec := m.newRecord(req, tpl.Name, iso, now)
	fctx, cancel := context.WithTimeout(ctx, m.cfg.ReadyTimeout+30*time.Second)
	defer cancel()
	e := newEntry(rec, nil)
	e.op <- struct{}{} // held until claimed: nobody else sees the entry
	c := &creation{e: e, req: req, tpl: tpl, policy: policy.Policy{Mode: policy.ModeNone}, log: m.log.With("sandbox_id", rec.ID, "warm", true), start: now}
	err = m.provision(fctx, c)
	if err == nil {
		err = m.awaitReady(fctx, c)
	}
	if err != nil {
		if uerr := c.undo.unwind(context.WithoutCancel(ctx)); uerr != nil {
			c.log.Error("undo_warm", "err", uerr)
		}
		return nil, err
	}
	if cn, ok := m.deps.Prober.(Connector); ok {
		// Not needed: a claim without it dials.
		if err := cn.Connect(fctx, agentAddr(c.e.att)); err != nil {
			c.log.Debug("warm_connect", "err", err)
		}
	}
	c.log.Debug("warm_ready", "template", name.Template, "allow_sudo", name.AllowSudo, "elapsed_ms", time.Since(now).Milliseconds())
	return &warm{c: c, iso: iso, gen: gen}, nil
}

// drainPools destroys every pooled sandbox (the Manager is closing: a
// restarted daemon could not tell them from leftovers).
func (m *Manager) drainPools() {
	ws, _ := m.pool.drain("")
	m.discard(ws...)
}

// claimable reports whether a create may take a pooled sandbox: it asks
// for nothing a running sandbox cannot be given. (allow_sudo cannot be
// given either, nor taken away; claim looks in the pool made with the
// request's.)
func (m *Manager) claimable(req CreateRequest, p policy.Policy) bool {
	if req.Layers != nil || req.Setup != nil || len(req.Volumes) > 0 {
		return false
	}
	// Without egress services a policy other than none fails the create
	// either way; let the cold path say so.
	return m.deps.Egress != nil || p.Mode == "" || p.Mode == policy.ModeNone
}

// errNoClaim means a pooled sandbox could not be used; Create makes one.
var errNoClaim = errors.New("no warm sandbox")

// claim hands a pooled sandbox to a validated request. errNoClaim (the
// pool has none that fits, or the one taken failed before anyone saw it)
// sends the caller down the cold path; any other error is the create's.
func (m *Manager) claim(ctx context.Context, req CreateRequest, tpl template.Template, iso string, p policy.Policy) (Sandbox, error) {
	if !m.claimable(req, p) {
		return Sandbox{}, errNoClaim
	}
	key := WarmKey{Template: tpl.Name, AllowSudo: req.sudo()}
	for {
		w := m.pool.take(key, iso)
		if w == nil {
			return Sandbox{}, errNoClaim
		}
		m.pool.poke() // refill behind the claim
		pc := w.c
		if pc.e.rec.AllowSudo != req.sudo() {
			// Cannot be: take looked in the pool of the request's
			// allow_sudo. Never hand it over.
			m.log.Error("warm_sudo_mismatch", "sandbox_id", pc.e.id, "template", tpl.Name)
			m.discard(w)
			continue
		}
		if !slices.Equal(pc.tpl.Layers, tpl.Layers) || !reflect.DeepEqual(pc.tpl.Defaults, tpl.Defaults) {
			// Made from an older build; TemplateChanged drains these
			// too, this catches a change it was not told about.
			m.log.Info("warm_stale", "sandbox_id", pc.e.id, "template", tpl.Name)
			m.discard(w)
			continue
		}
		if pc.e.rec.DiskBytes != req.Limits.DiskBytes {
			m.log.Debug("warm_miss", "template", tpl.Name, "reason", "disk size")
			if d := m.pool.giveBack(key, w); d != nil {
				m.discard(d)
			}
			return Sandbox{}, errNoClaim
		}
		return m.claimOne(ctx, req, tpl, p, key, w)
	}
}

func (m *Manager) claimOne(ctx context.Context, req CreateRequest, tpl template.Template, p policy.Policy, key WarmKey, w *warm) (Sandbox, error) {
	c, e := w.c, w.c.e
	pool := e.rec
	rt := m.runtimeOf(pool)
	limits := runtime.Limits{CPUMillis: req.Limits.CPUMillis, MemoryBytes: req.Limits.MemoryBytes, PidsLimit: req.Limits.PidsLimit}
	same := limits == runtime.Limits{CPUMillis: pool.CPUMillis, MemoryBytes: pool.MemoryBytes, PidsLimit: pool.PidsLimit}
	up, canUpdate := rt.(Updater)
	if !same && !canUpdate {
		m.log.Debug("warm_miss", "template", tpl.Name, "reason", "limits cannot change")
		if d := m.pool.giveBack(key, w); d != nil {
			m.discard(d)
		}
		return Sandbox{}, errNoClaim
	}
	now := time.Now().UTC()
	rec := pool
	rec.CPUMillis, rec.MemoryBytes, rec.PidsLimit = req.Limits.CPUMillis, req.Limits.MemoryBytes, req.Limits.PidsLimit
	rec.Env = maps.Clone(req.Env)
	rec.Labels = maps.Clone(req.Labels)
	if rec.Env == nil {
		rec.Env = map[string]string{}
	}
	if rec.Labels == nil {
		rec.Labels = map[string]string{}
	}
	rec.Owner, rec.Metadata, rec.User = req.Owner, maps.Clone(req.Metadata), req.User
	rec.OnTimeout, rec.AutoResume, rec.IdlePause = req.OnTimeout, req.AutoResume, req.IdlePause
	rec.Token = newToken()
	rec.CreatedAt, rec.Deadline = now, now.Add(req.Timeout)

	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	m.mu.Lock()
	if err := m.admitLocked(rec.Owner, req.Quota, req.Limits, ""); err != nil {
		m.mu.Unlock()
		if d := m.pool.giveBack(key, w); d != nil {
			m.discard(d)
		}
		return Sandbox{}, err
	}
	// Counted by quotas from here on; still "creating", and its ID is
	// known to nobody, so no reader asks for it.
	e.rec, e.abort = rec, cancel
	e.publish()
	m.live[rec.ID] = e
	m.mu.Unlock()
	c.req, c.policy, c.start = req, p, now
	c.log = m.log.With("sandbox_id", rec.ID)

	// Until the record is written, a failure leaves no trace: the
	// sandbox goes and the caller makes one cold.
	fail := func(err error) (Sandbox, error) {
		c.log.Warn("warm_claim_failed", "err", err)
		m.forget(rec.ID)
		m.discard(w)
		return Sandbox{}, errNoClaim
	}
	var nproc uint64
	t0 := time.Now()
	if !same {
		var err error
		if nproc, err = up.Update(cctx, rec.ID, limits); err != nil {
			if errors.Is(err, errdefs.ErrNotImplemented) {
				// Nothing changed: the pool keeps it.
				m.forget(rec.ID)
				e.rec = pool
				e.publish()
				if d := m.pool.giveBack(key, w); d != nil {
					m.discard(d)
				}
				return Sandbox{}, errNoClaim
			}
			return fail(err)
		}
	}
	t1 := time.Now()
	if err := m.initAgent(cctx, e, pool.Token, rec, tpl, nproc); err != nil {
		return fail(err)
	}
	t2 := time.Now()
	if p.Mode != "" && p.Mode != policy.ModeNone {
		if err := m.applyPolicy(cctx, rec.ID, p); err != nil {
			return fail(fmt.Errorf("network policy: %w", err))
		}
	}
	t3 := time.Now()
	if err := e.moveTo(StateReady); err != nil {
		return fail(err)
	}
	if err := m.putWithEvents(cctx, e.rec, newEvent(rec.ID, EventCreated, "template "+tpl.Name+", isolation "+rec.Isolation+", warm"), newEvent(rec.ID, EventReady, "")); err != nil {
		return fail(fmt.Errorf("persist: %w", err))
	}
	e.publish()
	m.hub.notify(rec.ID)
	m.arm(e)
	e.unlock()
	c.log.Info("sandbox_ready", "template", tpl.Name, "isolation", rec.Isolation, "warm", true, "elapsed_ms", time.Since(now).Milliseconds())
	c.log.Debug("claim_phases", "admit", t0.Sub(now), "limits", t1.Sub(t0), "agent_init", t2.Sub(t1), "policy", t3.Sub(t2), "record", time.Since(t3))
	return Sandbox{Sandbox: e.rec}, nil
}

// initAgent hands the claimed sandbox's agent what a fresh one would have
// started with: the request's environment (over the template's and
// Berth's, as withTemplateEnv and egressEnv rank them), its default user,
// and its own token in place of the pool's.
func (m *Manager) initAgent(ctx context.Context, e *entry, poolToken string, rec core.Sandbox, tpl template.Template, nproc uint64) error {
	ai, ok := m.deps.Files.(AgentIniter)
	if !ok {
		return fmt.Errorf("agent init: %w", errdefs.ErrNotImplemented)
	}
	user := rec.User
	if user == "" {
		user = tpl.Defaults.User
	}
	return ai.Init(ctx, agentAddr(e.att), poolToken, rec.Env, rec.Token, user, nproc)
}
