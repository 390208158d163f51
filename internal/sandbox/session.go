package sandbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/runtime"
)

// A ready sandbox's requests end with it.
//
// Every proxied call into a sandbox (native exec, PTY, watch and files;
// the E2B data plane and preview traffic) runs under a context that ends
// when the sandbox leaves ready: it died (the monitor found its init or,
// under gVisor, its sentry gone: an OOM kill of the whole sandbox, a fork
// bomb, runsc exiting), it is being stopped, paused or destroyed. Without
// it a call into a gVisor sandbox whose sentry died would hang: the
// sandbox's network stack dies with the sentry and sends no reset, so the
// host's connection to the agent waits for an answer that never comes.
// The context's cause names the state the sandbox went to and why
// (errdefs.ErrFailedPrecondition), which the proxies hand to the client.

// running is one ready period of a sandbox: its context is cancelled, with
// the reason as cause, when the period ends.
type running struct {
	ctx    context.Context
	cancel context.CancelCauseFunc

	mu sync.Mutex
	// n counts the requests bound to it; drained, when someone waits,
	// is closed once n is back at 0.
	n       int
	drained chan struct{}
}

// join binds one more request, unless the period has ended.
func (r *running) join() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ctx.Err() != nil {
		return false
	}
	r.n++
	return true
}

func (r *running) leave() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.n--
	if r.n == 0 && r.drained != nil {
		close(r.drained)
		r.drained = nil
	}
}

// wait returns once no request is bound to the (ended) period any more,
// or ctx ends. A proxy's request ends once its connection to the agent is
// closed (reset: agentlink), so after wait the sandbox's network stack
// holds none of them.
func (r *running) wait(ctx context.Context) {
	r.mu.Lock()
	if r.n == 0 {
		r.mu.Unlock()
		return
	}
	if r.drained == nil {
		r.drained = make(chan struct{})
	}
	ch := r.drained
	r.mu.Unlock()
	select {
	case <-ch:
	case <-ctx.Done():
	}
}

func newRunning() *running {
	// Not the Manager's lifetime: a daemon that closes leaves its
	// sandboxes running, and its server ends its own requests.
	ctx, cancel := context.WithCancelCause(context.Background())
	return &running{ctx: ctx, cancel: cancel}
}

// endCause is why a sandbox's ready period ended, as its requests see it.
func (s *status) endCause(id string) error {
	why := ""
	switch s.state {
	case StateStopping, StateStopped, StateFailed:
		if s.rec.Reason != "" {
			why = ": " + s.rec.Reason
		}
	}
	return fmt.Errorf("sandbox %s is %s%s: %w", id, s.state, why, errdefs.ErrFailedPrecondition)
}

// AgentEndpoint is where a ready sandbox's agent answers and the access
// token it wants.
type AgentEndpoint struct {
	Addr, Token string
}

// AgentSession is Agent for a call that talks to the sandbox for a while
// (a proxied request, a stream). The returned context ends when ctx does
// or when the sandbox leaves ready (it died, was OOM-killed, is stopped,
// paused or destroyed); then context.Cause says which, and why, with
// errdefs.ErrFailedPrecondition. Call release when the call is done.
func (m *Manager) AgentSession(ctx context.Context, id string) (context.Context, AgentEndpoint, context.CancelFunc, error) {
	st, err := m.readyStatus(ctx, id)
	if err != nil {
		return nil, AgentEndpoint{}, nil, err
	}
	if !st.run.join() {
		return nil, AgentEndpoint{}, nil, context.Cause(st.run.ctx)
	}
	// A child of the ready period, so the sandbox's end reaches it
	// synchronously, before the teardown that follows it kills the
	// agent: a stream cut by that teardown finds its context already
	// ended with the reason. The caller's end reaches it through
	// AfterFunc; its values are the caller's.
	cctx, cancel := context.WithCancelCause(st.run.ctx)
	stop := context.AfterFunc(ctx, func() { cancel(context.Cause(ctx)) })
	var once sync.Once
	release := func() {
		stop()
		cancel(context.Canceled)
		once.Do(st.run.leave)
	}
	return bound{Context: cctx, caller: ctx}, AgentEndpoint{Addr: agentAddr(st.att), Token: st.rec.Token}, release, nil
}

// bound is a context that ends with a sandbox's ready period or with its
// caller's context, whichever ends first, and carries the caller's values
// and deadline.
type bound struct {
	context.Context
	caller context.Context
}

func (b bound) Deadline() (time.Time, bool) { return b.caller.Deadline() }

func (b bound) Value(key any) any {
	// The ready period's own chain holds only its cancellation (which
	// context.Cause reads); every other value is the caller's.
	if v := b.Context.Value(key); v != nil {
		return v
	}
	return b.caller.Value(key)
}

// EndCause is why ctx, a context from AgentSession (or one derived from
// it), ended when the sandbox's end ended it; nil when it has not ended or
// its caller ended it.
func EndCause(ctx context.Context) error {
	if ctx.Err() == nil {
		return nil
	}
	if cause := context.Cause(ctx); errors.Is(cause, errdefs.ErrFailedPrecondition) {
		return cause
	}
	return nil
}

// CheckRunning checks at once, as the monitor's next round would, that a
// ready sandbox still runs, and ends it with the reason if not. A proxy
// whose connection to the agent broke asks, so its caller hears why
// rather than a bare broken connection. It returns once the check is
// done or ctx ends.
//
// A killed init closes its sockets before the runtime sees it gone: the
// init of a PID namespace first kills and reaps every other process in
// it, and only then becomes a zombie. A check in between finds it
// running, so where the runtime reports the init's exit (InitWatcher) the
// check waits up to cutInitGrace for it and checks again.
func (m *Manager) CheckRunning(ctx context.Context, id string) {
	e, ok := m.lookup(id)
	if !ok {
		return
	}
	if !m.track() {
		return // closing
	}
	done := make(chan struct{})
	go func() {
		defer m.wg.Done()
		defer close(done)
		// Not ctx: a check that found the sandbox dead finishes its
		// teardown whoever stopped waiting.
		m.check(m.life, e)
		m.awaitCutInit(e)
	}()
	select {
	case <-done:
	case <-ctx.Done():
	}
}

// cutInitGrace bounds how long CheckRunning waits for the init of a
// sandbox whose agent connection broke to finish exiting.
const cutInitGrace = 3 * time.Second

// awaitCutInit waits, up to cutInitGrace, for the init of ready sandbox e
// to exit, and then checks it again; it returns at once if the check
// before ended the sandbox or the runtime cannot report the exit.
func (m *Manager) awaitCutInit(e *entry) {
	if st := e.cur.Load(); st.closed || st.state != StateReady {
		return
	}
	w, ok := m.runtimeOf(e.cur.Load().rec).(InitWatcher)
	if !ok {
		return
	}
	if runtime.ExitsWithin(m.life, cutInitGrace, func(ctx context.Context) (<-chan struct{}, error) { return w.InitExited(ctx, e.id) }) {
		m.check(m.life, e)
	}
}
