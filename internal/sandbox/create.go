package sandbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/core"
	"github.com/berth-sandbox/berth/internal/policy"
	"github.com/berth-sandbox/berth/internal/runtime"
	"github.com/berth-sandbox/berth/internal/template"
)

// creation is one Create in progress: what its steps share.
type creation struct {
	e      *entry
	req    CreateRequest
	tpl    template.Template
	policy policy.Policy
	log    *slog.Logger
	start  time.Time
	// egress is the egress preparation started once the network is
	// attached (nil until then).
	egress *egressPrep
	// undo removes what the steps made so far.
	undo undo
	// restore is set when the sandbox starts from a memory snapshot's
	// image rather than booting its agent.
	restore *memoryStart
	// load is the memory load of a sandbox started from an image, where
	// it goes on after the runtime's create returned (nil otherwise).
	load *pageLoad
	// egressInstalled is set once the BeforeStart hook wrote the egress
	// CA and resolver into the sandbox's root from the host.
	egressInstalled bool
	// recorded, provisioned, agentUp and answered are when the first
	// store write, provision, the agent's first answer and awaitReady
	// (with the egress install) ended (the debug log's create phases).
	recorded, provisioned, agentUp, answered time.Time
}

// Create makes a sandbox and returns once its agent answers. It runs
// provision, await-ready, the request's setup hook and finish; each step
// pushes how to undo what it makes onto one stack, and a failure at any
// step unwinds it and leaves the record in state failed with the reason.
//
// The create holds the sandbox's operation lock throughout (a setup can
// take minutes); readers never wait for it, and a destroy aborts it.
func (m *Manager) Create(ctx context.Context, req CreateRequest) (Sandbox, error) {
	pidsAsked := req.Limits.PidsLimit != 0
	unpin, restore, err := m.fromSnapshot(ctx, &req)
	if err != nil {
		return Sandbox{}, err
	}
	defer unpin()
	if err := m.validate(&req); err != nil {
		return Sandbox{}, err
	}
	if err := checkQuotaTimeout(req.Quota, req.Timeout); err != nil {
		return Sandbox{}, err
	}
	var policy policy.Policy
	if req.Network != nil {
		if err := m.checkPolicy(*req.Network); err != nil {
			return Sandbox{}, err
		}
		policy = req.Network.Normalize()
	}
	tpl, err := m.deps.Templates.Get(ctx, req.Template)
	if err != nil {
		return Sandbox{}, &FieldError{Field: "template", Err: err}
	}
	iso, err := m.resolveIsolation(req.Isolation, tpl.Isolation)
	if err != nil {
		return Sandbox{}, err
	}
	// A memory start keeps its image's limits (checkMemoryStart): the
	// agent's pids cgroup is in that image.
	if restore == nil {
		if err := fitPids(&req.Limits, iso, pidsAsked); err != nil {
			return Sandbox{}, err
		}
	}
	// Held until the record is live, so no delete of a volume it binds
	// slips in between (volumes.go).
	volsHeld := func() {}
	if len(req.Volumes) > 0 {
		m.vols.mu.RLock()
		volsHeld = sync.OnceFunc(m.vols.mu.RUnlock)
		defer volsHeld()
	}
	vols, err := m.resolveVolumes(ctx, req)
	if err != nil {
		return Sandbox{}, err
	}
	// The pool refills only while no create runs (pool.go).
	m.pool.createStarted()
	defer m.pool.createDone()
	if restore != nil {
		if err := m.checkMemoryStart(req, iso); err != nil {
			return Sandbox{}, err
		}
	} else if s, err := m.claim(ctx, req, tpl, iso, policy); !errors.Is(err, errNoClaim) {
		return s, err
	}
	now := time.Now().UTC()
	rec := m.newRecord(req, tpl.Name, iso, now)
	rec.Volumes = vols
	rec.Deadline = now.Add(req.Timeout)
	rec.OnTimeout, rec.AutoResume, rec.IdlePause = req.OnTimeout, req.AutoResume, req.IdlePause
	// The sandbox must not die with the request that asked for it; a
	// kill while it is still being made (a long workspace setup, say)
	// aborts it through abort.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.cfg.ReadyTimeout+30*time.Second+req.setupTimeout()+startBudget(tpl.Defaults))
	defer cancel()
	e := newEntry(rec, cancel)
	e.op <- struct{}{} // free: nobody else has seen the entry yet
	defer e.unlock()
	m.mu.Lock()
	if err := m.admitLocked(rec.Owner, req.Quota, req.Limits, ""); err != nil {
		m.mu.Unlock()
		return Sandbox{}, err
	}
	m.live[rec.ID] = e
	m.mu.Unlock()
	volsHeld()
	how := "template " + tpl.Name + ", isolation " + iso
	if restore != nil {
		how += ", from the memory of snapshot " + restore.snapshot
	}
	if err := m.putWithEvents(cctx, rec, newEvent(rec.ID, EventCreated, how)); err != nil {
		m.forget(rec.ID)
		return Sandbox{}, err
	}
	m.hub.notify(rec.ID)
	c := &creation{e: e, req: req, tpl: tpl, policy: policy, log: m.log.With("sandbox_id", rec.ID), start: now, recorded: time.Now(), restore: restore}

	if err := m.provision(cctx, c); err != nil {
		return m.abandon(cctx, c, err)
	}
	c.provisioned = time.Now()
	if err := m.awaitReady(cctx, c); err != nil {
		return m.abandon(cctx, c, err)
	}
	c.answered = time.Now()
	// A sandbox started from a memory image runs what its source ran,
	// the template's start command included.
	if c.restore == nil {
		if err := m.startTemplate(cctx, c); err != nil {
			return m.abandon(cctx, c, err)
		}
	}
	if req.Setup != nil {
		// Setup runs under cctx (budgeted for it, not tied to the request,
		// cancelled by a kill); what follows gets a fresh budget.
		serr := req.Setup(cctx, &SetupHandle{m: m, e: e})
		cctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), 60*time.Second)
		defer cancel()
		if serr != nil {
			return m.abandon(cctx, c, fmt.Errorf("setup: %w", serr))
		}
	}
	if err := m.finish(cctx, c); err != nil {
		return m.abandon(cctx, c, err)
	}
	m.guardPageLoad(e, c.load, "create")
	return Sandbox{Sandbox: e.rec}, nil
}

// provision makes the sandbox on the host: the runtime's container, and
// from its BeforeStart hook the network attachment and (while the agent
// starts) the egress services.
func (m *Manager) provision(ctx context.Context, c *creation) error {
	e := c.e
	id := e.id
	rt := m.runtimeOf(e.rec)
	spec := runtime.Spec{
		ID:           id,
		Layers:       c.tpl.Layers,
		DiskBytes:    e.rec.DiskBytes,
		CPUMillis:    e.rec.CPUMillis,
		MemoryBytes:  e.rec.MemoryBytes,
		PidsLimit:    e.rec.PidsLimit,
		Hostname:     "berth-" + id[:12],
		AgentPath:    m.cfg.AgentPath,
		AgentArgs:    withWorkdir(withTemplateArgs(agentArgs(e.rec), e.rec, c.tpl.Defaults), c.req.Workdir),
		AgentEnv:     m.egressEnv(withTemplateEnv(agentEnv(e.rec), e.rec, c.tpl.Defaults)),
		AgentSecret:  agentSecret(e.rec),
		AgentPids:    agentPids(e.rec),
		WorkloadPids: workloadPids(e.rec),
		AllowSetuid:  e.rec.AllowSudo,
		// The sandbox gets a network namespace of its own user namespace
		// (so its /sys is its own); the host wires the veth into it
		// while the agent starts (runc) or before (gVisor). The hook
		// runs within Runtime.Create, which returns after it, so it
		// pushes onto the same undo stack.
		BeforeStart: func(bctx context.Context, pid int) error {
			c.undo.push("network", func(ctx context.Context) error { return m.deps.Network.Detach(ctx, id) })
			att, err := m.deps.Network.AttachTo(bctx, id, "/proc/"+strconv.Itoa(pid)+"/ns/net")
			if err != nil {
				return fmt.Errorf("network: %w", err)
			}
			e.att = att
			c.undo.push("egress", func(context.Context) error {
				_, _ = c.egress.wait() // never remove under its feet (nil: never started); its error was the create's
				return m.removeEgress(id)
			})
			if c.restore != nil {
				if err := m.adoptSourceCA(id, c.restore.image); err != nil {
					return fmt.Errorf("network policy: %w", err)
				}
			} else {
				// A fresh sandbox gets its egress files from the host
				// here; one from a memory image (above) has its
				// source's in its page cache and gets them through its
				// agent once it answers (awaitReady).
				if c.egressInstalled, err = m.installEgressFromHost(rt, e); err != nil {
					return fmt.Errorf("network policy: %w", err)
				}
			}
			// The egress services need the attachment, not the agent:
			// they come up while the agent starts, under the create's
			// context (BeforeStart's ends with the runtime's Create).
			c.egress = m.prepareEgressAsync(ctx, e, c.policy)
			return nil
		},
	}
	if c.req.Layers != nil {
		spec.Layers = c.req.Layers
	}
	if c.restore != nil {
		spec.RestoreImage = c.restore.image
	}
	mounts, release, err := m.mountVolumes(ctx, e.rec)
	if err != nil {
		return &FieldError{Field: "volumes", Err: err}
	}
	defer release() // bound into the sandbox by then
	spec.Mounts = mounts
	// Pushed first, so unwound last: a Create that fails half-way may
	// leave a container behind, and Destroy takes whatever is there.
	c.undo.push("runtime", func(ctx context.Context) error { return rt.Destroy(ctx, id) })
	if err := rt.Create(ctx, spec); err != nil {
		return fmt.Errorf("runtime: %w", err)
	}
	if c.restore != nil {
		c.load = m.watchPageLoad(rt, id)
	}
	return nil
}

// awaitReady waits until the agent answers and the egress services are
// up, then writes the egress CA and resolver into the sandbox.
func (m *Manager) awaitReady(ctx context.Context, c *creation) error {
	rctx, rcancel := context.WithTimeout(ctx, m.cfg.ReadyTimeout)
	exited := m.watchInit(rctx, rcancel, c.e)
	c.load.cancelOnFailure(rctx, rcancel)
	err := m.deps.Prober.WaitReady(rctx, agentAddr(c.e.att))
	rcancel()
	c.agentUp = time.Now()
	ca, eerr := c.egress.wait()
	if lerr := c.load.loadFailure(); lerr != nil {
		return lerr
	}
	if err != nil && exited.Load() {
		rt := m.runtimeOf(c.e.rec)
		why := runtime.ErrInitExited.Error()
		if w, ok := rt.(InitWatcher); ok {
			if tail := w.AgentLogTail(c.e.id); tail != "" {
				why += "; the agent's last words: " + tail
			}
		}
		if report := crashReport(rt, c.e.id); report != "" {
			why += "; " + report
		}
		return fmt.Errorf("agent did not become ready: %s: %w", why, errdefs.ErrUnavailable)
	}
	if err != nil {
		return fmt.Errorf("agent did not become ready: %w", err)
	}
	if eerr != nil {
		return fmt.Errorf("network policy: %w", eerr)
	}
	if c.restore != nil {
		if err := m.reidentify(ctx, c); err != nil {
			return err
		}
	}
	if c.egressInstalled {
		return nil
	}
	if err := m.installEgress(ctx, c.e, ca); err != nil {
		return fmt.Errorf("network policy: %w", err)
	}
	return nil
}

// initWatchDelay is how long a create waits for its agent before it also
// watches the sandbox's init: most agents answer sooner, and those
// creates then pay nothing for the watch.
const initWatchDelay = 300 * time.Millisecond

// watchInit ends the wait for a sandbox's agent (cancel) as soon as the
// sandbox's init exits, where the runtime can report that (InitWatcher):
// an agent that died while starting would otherwise be waited for until
// the ready timeout. The flag it returns is set when that happened.
func (m *Manager) watchInit(ctx context.Context, cancel context.CancelFunc, e *entry) *atomic.Bool {
	exited := new(atomic.Bool)
	w, ok := m.runtimeOf(e.rec).(InitWatcher)
	if !ok {
		return exited
	}
	go func() {
		t := time.NewTimer(initWatchDelay)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		done, err := w.InitExited(ctx, e.id)
		if err != nil {
			m.log.Debug("init_watch_failed", "sandbox_id", e.id, "err", err)
			return
		}
		select {
		case <-done:
			exited.Store(true)
			cancel()
		case <-ctx.Done():
		}
	}()
	return exited
}

// finish records the sandbox as ready, publishes it to readers and arms
// its deadline. Nothing after the store write can fail.
func (m *Manager) finish(ctx context.Context, c *creation) error {
	e := c.e
	if err := e.moveTo(StateReady); err != nil {
		return err
	}
	if err := m.putWithEvents(ctx, e.rec, newEvent(e.id, EventReady, "")); err != nil {
		return fmt.Errorf("persist: %w", err)
	}
	e.publish()
	m.hub.notify(e.id)
	m.arm(e)
	c.log.Info("sandbox_ready", "template", c.tpl.Name, "isolation", e.rec.Isolation, "elapsed_ms", time.Since(c.start).Milliseconds())
	if !c.provisioned.IsZero() && !c.answered.IsZero() {
		c.log.Debug("create_phases", "record", c.recorded.Sub(c.start), "provision", c.provisioned.Sub(c.recorded),
			"agent_ready", c.agentUp.Sub(c.provisioned), "policy_apply", c.answered.Sub(c.agentUp),
			"finish", time.Since(c.answered), "total", time.Since(c.start))
	}
	return nil
}

// abandon ends a failed create: it unwinds the undo stack, records the
// sandbox as failed with the reason and forgets it.
func (m *Manager) abandon(ctx context.Context, c *creation, err error) (Sandbox, error) {
	e := c.e
	err = fmt.Errorf("create sandbox %s: %w", e.id, err)
	// The create's context may be what ended (an abort): recording the
	// failure must not depend on it.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 60*time.Second)
	defer cancel()
	if uerr := c.undo.unwind(ctx); uerr != nil {
		c.log.Error("undo_create", "err", uerr)
	}
	if merr := e.moveTo(StateFailed); merr != nil {
		c.log.Error("undo_create", "err", merr)
		e.rec.State = string(StateFailed)
	}
	e.rec.Reason = err.Error()
	e.rec.EndedAt = time.Now().UTC()
	e.publish()
	if perr := m.deps.Store.PutSandbox(ctx, e.rec); perr != nil {
		c.log.Error("persist_failed_state", "err", perr)
	}
	m.event(ctx, e.id, EventFailed, err.Error())
	m.forget(e.id)
	return Sandbox{Sandbox: e.rec}, err
}

// egressPrep is an egress preparation running while the agent starts.
type egressPrep struct {
	done chan struct{}
	ca   []byte
	err  error
}

// prepareEgressAsync starts prepareEgress; the create that started it
// always waits for it (awaitReady, or its undo).
func (m *Manager) prepareEgressAsync(ctx context.Context, e *entry, p policy.Policy) *egressPrep {
	ep := &egressPrep{done: make(chan struct{})}
	go func() {
		defer close(ep.done)
		ep.ca, ep.err = m.prepareEgress(ctx, e, p)
	}()
	return ep
}

// wait returns the preparation's result once it is done.
func (ep *egressPrep) wait() ([]byte, error) {
	if ep == nil {
		return nil, errors.New("egress was never prepared")
	}
	<-ep.done
	return ep.ca, ep.err
}

// newRecord is the record of a sandbox about to be made from req: a fresh
// ID and agent token, state creating, no deadline yet. Cold creates and
// warm-pool fills share it so a claimed sandbox's record has the same shape.
func (m *Manager) newRecord(req CreateRequest, template, iso string, now time.Time) core.Sandbox {
	rec := core.Sandbox{
		ID:             newID(),
		State:          string(StateCreating),
		Template:       template,
		CPUMillis:      req.Limits.CPUMillis,
		MemoryBytes:    req.Limits.MemoryBytes,
		DiskBytes:      req.Limits.DiskBytes,
		PidsLimit:      req.Limits.PidsLimit,
		Env:            maps.Clone(req.Env),
		Labels:         maps.Clone(req.Labels),
		Owner:          req.Owner,
		Metadata:       maps.Clone(req.Metadata),
		User:           req.User,
		Isolation:      iso,
		RuntimeVersion: m.runtimeVersion(iso),
		AllowSudo:      req.sudo(),
		Token:          newToken(),
		CreatedAt:      now,
	}
	if rec.Env == nil {
		rec.Env = map[string]string{}
	}
	if rec.Labels == nil {
		rec.Labels = map[string]string{}
	}
	return rec
}
