package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	vkerrdefs "github.com/virtual-kubelet/virtual-kubelet/errdefs"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	corev1listers "k8s.io/client-go/listers/core/v1"
	"k8s.io/utils/ptr"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/errdefs"
)

// podLease is the deadline a pod's sandbox is created with and renewed to
// (the daemon's longest); renewEvery is how often the node renews it.
const (
	podLease   = 24 * time.Hour
	renewEvery = time.Hour
)

// Pods runs the pods bound to one node as Berth sandboxes. It is the
// virtual-kubelet PodLifecycleHandler and PodNotifier of the node.
type Pods struct {
	node    string
	ip      string
	sb      Sandboxes
	backOff backOff
	kube    kubernetes.Interface
	log     *slog.Logger
	// ctx is the node's lifetime: sandboxes are made and watched under
	// it, never under a request's context.
	ctx context.Context
	wg  sync.WaitGroup

	// syncEvery is the config sync period (filevolumes.go).
	syncEvery time.Duration
	// services lists the cluster's Services for containers' service
	// environment variables (env.go); nil: none.
	services corev1listers.ServiceLister

	mu     sync.Mutex
	pods   map[string]*podState // by namespace/name
	notify func(*corev1.Pod)

	// alloc is the node's allocatable cpu and memory, the room its
	// running pods may request together; nil admits anything (room.go).
	alloc corev1.ResourceList
	// onRoom, when set, is called when a pod starts or stops giving its
	// room back (the node's allocatable moves); roomKick wakes roomLoop.
	onRoom   func()
	roomKick chan struct{}
}

type podState struct {
	pod     *corev1.Pod
	plan    plan
	started time.Time
	cancel  context.CancelFunc

	sandboxID string
	podIP     string
	// reason and message, once set, fail the pod: it could not be made,
	// or its sandbox ended under it.
	reason, message string
	deleted         bool
	containers      map[string]*containerState

	// applied is the AnnotationDeadline value the sandbox's deadline was
	// last set from; dmu orders the settings.
	applied string
	dmu     sync.Mutex
	// net is the sandbox's egress policy against AnnotationNetwork
	// (network.go); dmu orders its changes too.
	net netState
	// pz is the sandbox's pause against AnnotationPaused (pause.go); dmu
	// orders it too. up says the pod's processes are started (start
	// began; a pause asked for before waits for that).
	pz pauseState
	up bool
	// gaveRoom is givesRoom as changed last saw it, phase the phase it
	// last reported (room.go).
	gaveRoom bool
	phase    corev1.PodPhase
	// initialized: every init container succeeded (true without any).
	initialized bool
	// volFiles are the files of its configMap and secret volumes the
	// node wrote (filevolumes.go).
	volFiles []string
	// tokens are the service account tokens its volumes hold, by what
	// they were asked with (tokenKey).
	tokens map[string]podToken
	// tick, once asked for, is closed at the pod's next change (await).
	tick chan struct{}
	// nmu orders the pod's status reports (changed).
	nmu sync.Mutex
	// sideStop holds, by sidecar, the channel closed to stop it once the
	// containers are done (inits.go).
	sideStop map[string]chan struct{}

	// ctx is the pod's context (cancel ends it); fcancel ends the current
	// generation of its container followers, fwg counts them.
	ctx     context.Context
	fcancel context.CancelFunc
	fwg     sync.WaitGroup
}

// containerState is a container's current run (running, or exited with
// its code), the run before it, and its restarts.
type containerState struct {
	running    bool
	startedAt  time.Time
	exited     bool
	exitCode   int
	finishedAt time.Time

	// restarts is the container's restart count; last is its previous
	// run, once it has one.
	restarts int
	last     *containerRun
	// backOff, while the current run is exited, is the wait before the
	// next (CrashLoopBackOff); steps counts the restarts since the
	// back-off was last reset.
	backOff time.Duration
	steps   int

	// unstarted: the run's startup probe has not passed yet; unready:
	// its readiness probe has not passed, or failed since (probe.go).
	unstarted, unready bool

	// waitReason and waitMessage, while set, say why its next run waits
	// for its configuration (a ConfigMap or Secret: awaitConfig).
	waitReason, waitMessage string
}

func newPods(ctx context.Context, nodeName, nodeIP string, sb Sandboxes, kube kubernetes.Interface, bo backOff, log *slog.Logger) *Pods {
	return &Pods{ctx: ctx, node: nodeName, ip: nodeIP, sb: sb, kube: kube, backOff: bo, log: log, pods: map[string]*podState{}, roomKick: make(chan struct{}, 1)}
}

func key(ns, name string) string { return ns + "/" + name }

// Wait waits for every goroutine the pods started (their contexts end with
// the node's).
func (p *Pods) Wait() { p.wg.Wait() }

// NotifyPods registers the callback that reports a pod's new status.
func (p *Pods) NotifyPods(_ context.Context, fn func(*corev1.Pod)) {
	p.mu.Lock()
	p.notify = fn
	p.mu.Unlock()
}

// changed reports ps's status; call without p.mu held.
func (p *Pods) changed(ps *podState) {
	// A status is sent before the next is made: the last one sent is the
	// latest, whichever goroutines change the pod at once.
	ps.nmu.Lock()
	defer ps.nmu.Unlock()
	p.mu.Lock()
	if ps.tick != nil {
		close(ps.tick)
		ps.tick = nil
	}
	fn := p.notify
	pod := p.withStatus(ps)
	ps.phase = pod.Status.Phase
	p.mu.Unlock()
	if fn != nil {
		fn(pod)
	}
	p.roomChangedBy(ps)
}

// CreatePod makes the pod's sandbox and starts its containers. The work
// runs in the background; the pod stays Pending until it is done.
func (p *Pods) CreatePod(_ context.Context, pod *corev1.Pod) error {
	k := key(pod.Namespace, pod.Name)
	p.mu.Lock()
	if old, ok := p.pods[k]; ok && old.pod.UID == pod.UID {
		p.mu.Unlock()
		return nil
	}
	ctx, cancel := context.WithCancel(p.ctx)
	ps := &podState{pod: pod.DeepCopy(), started: time.Now(), ctx: ctx, cancel: cancel, containers: map[string]*containerState{},
		applied: pod.Annotations[AnnotationDeadline], net: netState{applied: pod.Annotations[AnnotationNetwork], known: true}}
	p.pods[k] = ps
	p.mu.Unlock()

	if why := pod.Annotations[AnnotationLost]; why != "" {
		// Reported lost while this node was away: it is not made again
		// here.
		p.fail(ps, ReasonNodeLost, why)
		return nil
	}
	pl, err := planPod(pod, p.node)
	if err != nil {
		p.fail(ps, "BerthInvalidPod", err.Error())
		return nil
	}
	if !p.admit(ps) {
		return nil
	}
	p.mu.Lock()
	ps.plan = pl
	p.mu.Unlock()
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		p.run(ctx, ps)
	}()
	return nil
}

// run makes the sandbox, starts each container's process and follows them.
func (p *Pods) run(ctx context.Context, ps *podState) {
	sb, err := p.sb.Create(ctx, ps.plan.req)
	if err != nil {
		if ctx.Err() == nil {
			p.fail(ps, "BerthCreateFailed", err.Error())
		}
		return
	}
	p.mu.Lock()
	ps.sandboxID = sb.ID
	gone := ps.deleted || ps.reason != ""
	p.mu.Unlock()
	if gone {
		// Deleted, or reported lost, while it was being made.
		if err := p.kill(sb.ID); err != nil {
			p.log.Warn("sandbox_destroy_failed", "sandbox_id", sb.ID, "err", err)
		}
		return
	}
	// Create's answer leaves out where the sandbox sits; a get has it.
	if full, err := p.sb.Get(ctx, sb.ID); err == nil {
		sb = full
	}
	if !p.adopt(ctx, ps, sb) {
		return
	}
	// The deadline and the policy may have moved while the sandbox was
	// being made.
	p.applyDeadline(ctx, ps)
	p.applyNetwork(ctx, ps)
	restored, ok := p.prepare(ctx, ps, sb.ID)
	if !ok {
		return
	}
	p.start(ctx, ps, restored, time.Time{})
}

// prepare readies sandbox id for the pod's processes (prepareOnce) and
// returns those that came back with it. The daemon may pause the sandbox
// meanwhile (idle, or at its deadline under AnnotationOnTimeout pause),
// while a missing ConfigMap holds the volumes, say: what failed is done
// again once the sandbox is resumed, and the pod stays Pending, paused,
// until then. false: the pod failed, was deleted, or ctx ended.
func (p *Pods) prepare(ctx context.Context, ps *podState, id string) (map[string]uint32, bool) {
	for {
		restored, err := p.prepareOnce(ctx, ps, id)
		if err == nil {
			// Once: a try a pause cut off after the volumes were filled
			// must not start a second sync.
			p.syncVolumesEvery(ps, p.syncEvery)
			return restored, true
		}
		if ctx.Err() != nil {
			return nil, false
		}
		if !p.awaitResumed(ctx, ps, id) {
			if ctx.Err() == nil {
				p.fail(ps, "BerthStartFailed", err.Error())
			}
			return nil, false
		}
		p.log.Info("pod_prepare_again", "pod", key(ps.pod.Namespace, ps.pod.Name), "sandbox_id", id, "after", err.Error())
	}
}

// prepareOnce makes the containers' log directory, fills the volumes and
// reads what processes came back with the sandbox.
func (p *Pods) prepareOnce(ctx context.Context, ps *podState, id string) (map[string]uint32, error) {
	// The containers' log directory exists before any of them starts: a
	// log follower watches it from the container's start on.
	if err := p.sb.MakeDir(ctx, id, podDir); err != nil && !errors.Is(err, errdefs.ErrAlreadyExists) {
		return nil, fmt.Errorf("make %s: %w", podDir, err)
	}
	home, err := makeVolumes(ctx, p.sb, id, ps.plan.volumes)
	if err == nil {
		// A missing ConfigMap or Secret holds every container in
		// ContainerCreating until it is there, as a kubelet's mount does.
		err = p.awaitConfig(ctx, ps, ps.plan.names(), reasonCreating, func() error {
			return p.fillVolumes(ctx, ps, id, home)
		})
	}
	if err != nil {
		return nil, err
	}
	return p.restored(ctx, ps)
}

// awaitResumed waits, when sandbox id is paused (or being paused), until
// it runs again: true then; false when it was not paused at the first
// look (what failed failed for another reason), when it ends, or when the
// pod failed or was deleted, or ctx ended. A pause's start and its end
// each change the pod (the sandbox watch, applyPause), so it looks again
// at each change.
func (p *Pods) awaitResumed(ctx context.Context, ps *podState, id string) bool {
	paused := false
	for {
		// The change to wait for is taken before the look, so one
		// between the two is not missed.
		p.mu.Lock()
		tick, ok := p.nextChangeLocked(ps)
		p.mu.Unlock()
		if !ok {
			return false
		}
		sb, err := p.sb.Get(ctx, id)
		if err != nil {
			return false
		}
		switch sb.State {
		case client.StateReady:
			return paused
		case client.StatePausing, client.StatePaused, client.StateResuming:
			paused = true
		default:
			return false
		}
		select {
		case <-ctx.Done():
			return false
		case <-tick:
		}
	}
}

// start runs the pod's init containers, then starts its containers, under
// one generation of followers: the sidecars' carry on beside the
// containers', and a pause (stopFollowers) ends the init containers'
// run too, which refollow starts again at resume. restored are the
// processes already running in the sandbox by tag (a restarted node's, a
// snapshot's, or a resumed sandbox's); pausedAt, once set, is when a
// filesystem pause ended the ones that do not run any more.
func (p *Pods) start(ctx context.Context, ps *podState, restored map[string]uint32, pausedAt time.Time) {
	// From here on the pod may be paused; a pause asked for while its
	// sandbox was made is done first.
	p.mu.Lock()
	ps.up = true
	p.mu.Unlock()
	p.applyPause(ctx, ps)
	// dmu orders this against a pause: one done before is seen here (the
	// resume starts again), one after ends these followers.
	ps.dmu.Lock()
	p.mu.Lock()
	paused := ps.pz.paused
	p.mu.Unlock()
	if paused {
		ps.dmu.Unlock()
		return
	}
	fctx := p.newFollowers(ps)
	ps.fwg.Add(1)
	ps.dmu.Unlock()
	defer ps.fwg.Done()
	if p.runInits(fctx, ps, restored, pausedAt) {
		p.startContainers(fctx, ps, restored)
	}
}

// startContainers starts the pod's containers in its sandbox, or follows
// those whose processes came back with it (restored, by tag), under ctx
// (its followers').
func (p *Pods) startContainers(ctx context.Context, ps *podState, restored map[string]uint32) {
	for _, c := range ps.plan.containers {
		if len(c.argv) == 0 {
			p.setContainer(ps, c.name, func(cs *containerState) { cs.running, cs.startedAt = true, time.Now() })
			continue
		}
		if pid, ok := restored[processTag(c.name)]; ok {
			// The container's process came back with the snapshot's
			// memory: it carries on.
			p.setContainer(ps, c.name, func(cs *containerState) { cs.running, cs.startedAt = true, time.Now() })
			p.follow(ctx, ps, c, pid)
			continue
		}
		pid, err := p.startContainer(ctx, ps, c, 0)
		if err != nil {
			if ctx.Err() == nil {
				p.fail(ps, "BerthStartFailed", fmt.Sprintf("container %s: %v", c.name, err))
			}
			return
		}
		p.follow(ctx, ps, c, pid)
	}
}

// restored is, for a sandbox made from a snapshot, the processes that
// came back running with it (a memory snapshot's), by tag. A container
// whose process did not (a filesystem snapshot keeps files only) starts
// again in the snapshot's files.
func (p *Pods) restored(ctx context.Context, ps *podState) (map[string]uint32, error) {
	if ps.plan.req.Snapshot == "" {
		return nil, nil
	}
	running, err := p.runningByTag(ctx, ps.sandboxID)
	if err != nil {
		return nil, fmt.Errorf("made from snapshot %s: %w", ps.plan.req.Snapshot, err)
	}
	return running, nil
}

// runningByTag is the pids of the tagged processes running in sandbox id,
// by tag (a container's is processTag of its name).
func (p *Pods) runningByTag(ctx context.Context, id string) (map[string]uint32, error) {
	procs, err := p.sb.Processes(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("processes of sandbox %s: %w", id, err)
	}
	out := map[string]uint32{}
	for _, pr := range procs {
		if pr.Tag != "" {
			out[pr.Tag] = pr.PID
		}
	}
	return out, nil
}

// adopt records a live sandbox's address, follows its events, so the
// pod fails when the sandbox ends under it, and serves the pod's host
// ports; false when it could not serve them (the pod failed).
func (p *Pods) adopt(ctx context.Context, ps *podState, sb *client.Sandbox) bool {
	p.mu.Lock()
	if sb.Network != nil {
		ps.podIP = sb.Network.Address
	}
	p.mu.Unlock()
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		p.watchSandbox(ctx, ps, sb.ID)
	}()
	if err := p.serveHostPorts(ps); err != nil {
		p.fail(ps, "BerthStartFailed", err.Error())
		return false
	}
	return true
}

// collectExit reads the exit code the container's wrapper left. A process
// gone without one died with its sandbox (the sandbox watch reports that).
func (p *Pods) collectExit(ctx context.Context, ps *podState, name string) (int, bool) {
	code, at, err := p.readExit(ctx, ps.sandboxID, name, "")
	if err != nil {
		p.log.Debug("container_exit_unknown", "pod", key(ps.pod.Namespace, ps.pod.Name), "container", name, "err", err)
		return 0, false
	}
	p.setContainer(ps, name, func(cs *containerState) {
		cs.running, cs.exited, cs.exitCode, cs.finishedAt = false, true, code, at
	})
	return code, true
}

// watchSandbox fails the pod when its sandbox stops or fails under it:
// with ReasonDeadlineExceeded when its deadline ended it.
func (p *Pods) watchSandbox(ctx context.Context, ps *podState, id string) {
	deadline := false
	check := func() bool {
		sb, err := p.sb.Get(ctx, id)
		if err != nil {
			return false
		}
		switch sb.State {
		case client.StateStopped, client.StateFailed:
			reason := sb.Reason
			if reason == "" {
				reason = "the sandbox " + sb.State
			}
			if deadline {
				p.mu.Lock()
				at := ps.pod.Annotations[AnnotationDeadline]
				p.mu.Unlock()
				if at != "" {
					reason = "the sandbox's deadline " + at + " passed"
				}
				p.fail(ps, ReasonDeadlineExceeded, reason)
				return true
			}
			p.fail(ps, "BerthSandboxEnded", reason)
			return true
		}
		return false
	}
	err := p.sb.FollowEvents(ctx, id, func(ev client.Event) error {
		if ev.Type == client.EventDeadline {
			deadline = true
		}
		if ev.Type == client.EventPaused {
			// The deadline paused it (on-timeout pause) rather than
			// ending it.
			deadline = false
			p.pausedByDaemon(ctx, ps, id, ev)
		}
		switch ev.Type {
		case client.EventFailed, client.EventDestroyed, client.EventDeadline, client.EventOOM:
			if check() {
				return errStopFollow
			}
		}
		return nil
	})
	if ctx.Err() != nil {
		return
	}
	if err == nil || errors.Is(err, errdefs.ErrNotFound) {
		check()
	}
}

var errStopFollow = errors.New("stop following")

func (p *Pods) setContainer(ps *podState, name string, fn func(*containerState)) {
	p.mu.Lock()
	cs := ps.containers[name]
	if cs == nil {
		cs = &containerState{}
		ps.containers[name] = cs
	}
	fn(cs)
	p.mu.Unlock()
	p.changed(ps)
}

func (p *Pods) fail(ps *podState, reason, msg string) {
	p.mu.Lock()
	if ps.reason == "" && !ps.deleted {
		ps.reason, ps.message = reason, msg
	}
	p.mu.Unlock()
	p.log.Info("pod_failed", "pod", key(ps.pod.Namespace, ps.pod.Name), "reason", reason, "message", msg)
	p.changed(ps)
}

// kill destroys a sandbox under the node's lifetime, bounded.
func (p *Pods) kill(id string) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(p.ctx), 2*time.Minute)
	defer cancel()
	err := p.sb.Kill(ctx, id)
	if errors.Is(err, errdefs.ErrNotFound) {
		return nil
	}
	return err
}

// UpdatePod takes a changed pod's metadata (a running pod's spec does not
// change): a moved AnnotationDeadline becomes the sandbox's deadline, a
// changed AnnotationNetwork its egress policy (applyNetwork), and
// AnnotationLost ends the sandbox. A change of the rest of what the
// sandbox was made with (template, isolation, environment, user, sudo)
// cannot be applied to it: the pod fails with ReasonSettingsChanged and
// its sandbox ends, rather than run on with settings its pod no longer
// states.
func (p *Pods) UpdatePod(_ context.Context, pod *corev1.Pod) error {
	p.mu.Lock()
	ps, ok := p.pods[key(pod.Namespace, pod.Name)]
	if !ok || ps.pod.UID != pod.UID {
		p.mu.Unlock()
		return nil
	}
	lost := pod.Annotations[AnnotationLost] != "" && ps.pod.Annotations[AnnotationLost] == ""
	moved := pod.Annotations[AnnotationDeadline] != ps.applied
	if pod.Annotations[AnnotationNetwork] != ps.pod.Annotations[AnnotationNetwork] {
		// A new value gets its own try, even one refused before.
		ps.net.refused, ps.net.refusedErr = "", nil
	}
	renet := !ps.net.known || pod.Annotations[AnnotationNetwork] != ps.net.applied
	if pod.Annotations[AnnotationPaused] != ps.pod.Annotations[AnnotationPaused] ||
		ps.pz.byDaemon && pod.Annotations[AnnotationDeadline] != ps.pod.Annotations[AnnotationDeadline] {
		// A new request (for a daemon's pause, a new deadline) gets its
		// own try, even after a refusal.
		ps.pz.failed, ps.pz.failedErr = "", nil
	}
	repause := (pod.Annotations[AnnotationPaused] != "") != ps.pz.paused || ps.pz.byDaemon || ps.pz.noRoom
	changed := ""
	if ps.reason == "" && !ps.deleted && ps.plan.req.Template != "" {
		changed = settingsChange(ps.plan, pod)
	}
	ps.pod = pod.DeepCopy()
	p.mu.Unlock()
	// Under the node's lifetime, not the pod controller's call.
	switch {
	case changed != "":
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.end(ps, ReasonSettingsChanged, changed)
		}()
	case lost:
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.lose(ps)
		}()
	case moved || renet || repause:
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			// A resume comes first: the deadline that comes with it is
			// set on the running sandbox.
			p.applyPause(p.ctx, ps)
			p.applyDeadline(p.ctx, ps)
			p.applyNetwork(p.ctx, ps)
		}()
	}
	return nil
}

// applyDeadline sets the sandbox's deadline from the pod's
// AnnotationDeadline when it changed since it was last set.
func (p *Pods) applyDeadline(ctx context.Context, ps *podState) {
	ps.dmu.Lock()
	defer ps.dmu.Unlock()
	p.mu.Lock()
	pod, id, applied, over := ps.pod, ps.sandboxID, ps.applied, ps.reason != "" || ps.deleted
	p.mu.Unlock()
	want := pod.Annotations[AnnotationDeadline]
	if id == "" || over || want == applied {
		return
	}
	if _, err := podDeadline(pod); err != nil {
		p.log.Warn("pod_deadline_invalid", "pod", key(pod.Namespace, pod.Name), "err", err)
		return
	}
	d := sandboxTimeout(pod, time.Now())
	if err := p.sb.SetTimeout(ctx, id, d); err != nil {
		if ctx.Err() == nil {
			p.log.Warn("sandbox_deadline_failed", "pod", key(pod.Namespace, pod.Name), "sandbox_id", id, "err", err)
		}
		return
	}
	p.mu.Lock()
	ps.applied = want
	p.mu.Unlock()
	p.log.Info("sandbox_deadline_set", "pod", key(pod.Namespace, pod.Name), "sandbox_id", id, "deadline", want, "timeout", d)
}

// lose ends the sandbox of a pod the gateway reported lost: the pod fails
// with ReasonNodeLost first, so the sandbox's end does not read as its own.
func (p *Pods) lose(ps *podState) {
	p.mu.Lock()
	why := ps.pod.Annotations[AnnotationLost]
	p.mu.Unlock()
	p.end(ps, ReasonNodeLost, why)
}

// end fails the pod with reason first, then ends its sandbox, so the
// sandbox's end does not read as its own.
func (p *Pods) end(ps *podState, reason, why string) {
	p.mu.Lock()
	id := ps.sandboxID
	p.mu.Unlock()
	p.fail(ps, reason, why)
	ps.cancel()
	if id != "" {
		if err := p.kill(id); err != nil {
			p.log.Warn("sandbox_destroy_failed", "sandbox_id", id, "err", err)
		}
	}
}

// DeletePod destroys the pod's sandbox and reports the pod terminated.
func (p *Pods) DeletePod(_ context.Context, pod *corev1.Pod) error {
	k := key(pod.Namespace, pod.Name)
	p.mu.Lock()
	ps, ok := p.pods[k]
	if !ok {
		p.mu.Unlock()
		return vkerrdefs.NotFoundf("pod %s is not on node %s", k, p.node)
	}
	ps.deleted = true
	id := ps.sandboxID
	ps.cancel()
	now := time.Now()
	for _, c := range ps.plan.inits {
		// One running ends; one that never started stays waiting.
		if cs := ps.containers[c.name]; cs != nil && !cs.exited {
			cs.running, cs.exited, cs.exitCode, cs.finishedAt = false, true, 137, now
		}
	}
	for _, c := range ps.plan.containers {
		cs := ps.containers[c.name]
		if cs == nil {
			cs = &containerState{}
			ps.containers[c.name] = cs
		}
		if !cs.exited {
			cs.running, cs.exited, cs.exitCode, cs.finishedAt = false, true, 137, now
		}
		cs.backOff = 0
	}
	p.mu.Unlock()
	if id != "" {
		if err := p.kill(id); err != nil {
			return fmt.Errorf("destroy sandbox %s of pod %s: %w", id, k, err)
		}
	}
	p.changed(ps)
	p.mu.Lock()
	if p.pods[k] == ps {
		delete(p.pods, k)
	}
	p.mu.Unlock()
	return nil
}

// GetPod returns the pod with its current status.
func (p *Pods) GetPod(_ context.Context, namespace, name string) (*corev1.Pod, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	ps, ok := p.pods[key(namespace, name)]
	if !ok {
		return nil, vkerrdefs.NotFoundf("pod %s/%s is not on node %s", namespace, name, p.node)
	}
	return p.withStatus(ps), nil
}

// GetPodStatus returns the pod's current status.
func (p *Pods) GetPodStatus(ctx context.Context, namespace, name string) (*corev1.PodStatus, error) {
	pod, err := p.GetPod(ctx, namespace, name)
	if err != nil {
		return nil, err
	}
	return &pod.Status, nil
}

// GetPods returns every pod the node runs.
func (p *Pods) GetPods(context.Context) ([]*corev1.Pod, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]*corev1.Pod, 0, len(p.pods))
	for _, ps := range p.pods {
		out = append(out, p.withStatus(ps))
	}
	return out, nil
}

// sandboxOf is the sandbox of a pod's container, for logs and exec.
func (p *Pods) sandboxOf(namespace, name, container string) (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	ps, err := p.runningLocked(namespace, name)
	if err != nil {
		return "", err
	}
	named := func(c containerPlan) bool { return c.name == container }
	if !slices.ContainsFunc(ps.plan.containers, named) && !slices.ContainsFunc(ps.plan.inits, named) {
		return "", vkerrdefs.NotFoundf("pod %s/%s has no container %q", namespace, name, container)
	}
	return ps.sandboxID, nil
}

// podSandbox is the sandbox of pod namespace/name on this node.
func (p *Pods) podSandbox(namespace, name string) (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	ps, err := p.runningLocked(namespace, name)
	if err != nil {
		return "", err
	}
	return ps.sandboxID, nil
}

// runningLocked is pod namespace/name of this node, which has a sandbox;
// call with p.mu held.
func (p *Pods) runningLocked(namespace, name string) (*podState, error) {
	ps, ok := p.pods[key(namespace, name)]
	if !ok {
		return nil, vkerrdefs.NotFoundf("pod %s/%s is not on node %s", namespace, name, p.node)
	}
	if ps.sandboxID == "" {
		return nil, vkerrdefs.InvalidInputf("pod %s/%s has no sandbox yet", namespace, name)
	}
	return ps, nil
}

// withStatus is a copy of the pod with its status; call with p.mu held.
func (p *Pods) withStatus(ps *podState) *corev1.Pod {
	pod := ps.pod.DeepCopy()
	st := &pod.Status
	st.HostIP = p.ip
	if p.ip != "" {
		st.HostIPs = []corev1.HostIP{{IP: p.ip}}
	}
	st.PodIP = ps.podIP
	if ps.podIP != "" {
		st.PodIPs = []corev1.PodIP{{IP: ps.podIP}}
	}
	start := metav1.NewTime(ps.started)
	st.StartTime = &start
	st.ContainerStatuses, st.InitContainerStatuses = nil, nil
	initialized := ps.initialized || len(ps.plan.inits) == 0
	status := func(c containerPlan, specs []corev1.Container) corev1.ContainerStatus {
		var img string
		for _, sc := range specs {
			if sc.Name == c.name {
				img = sc.Image
			}
		}
		var id string
		if ps.sandboxID != "" {
			id = "berth://" + ps.sandboxID + "/" + c.name
		}
		s := containerStatus(c.name, img, id, ps.containers[c.name], ps.reason, ps.message, pod.Name+"_"+pod.Namespace+"("+string(pod.UID)+")")
		s.ImageID = "berth://" + ps.plan.req.Template
		return s
	}
	readyN, n := 0, len(ps.plan.containers)
	for _, c := range ps.plan.inits {
		s := status(c, pod.Spec.InitContainers)
		if cs := ps.containers[c.name]; cs == nil || (!cs.running && !cs.exited && cs.waitReason == "") {
			// Behind an init container that has not succeeded (yet),
			// never run: it stays waiting whatever ended the pod.
			s.State = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reasonPodInitializing}}
		}
		if c.sidecar {
			// A sidecar is ready as a container is, and counts toward
			// the pod's readiness.
			n++
			if s.Ready {
				readyN++
			}
		} else {
			// Ready once it succeeded, as the kubelet reports them.
			s.Ready = s.State.Terminated != nil && s.State.Terminated.ExitCode == 0
		}
		st.InitContainerStatuses = append(st.InitContainerStatuses, s)
	}
	for _, c := range ps.plan.containers {
		s := status(c, pod.Spec.Containers)
		if !initialized {
			s.State = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reasonPodInitializing}}
			s.Ready, s.Started = false, ptr.To(false)
		}
		if s.Ready {
			readyN++
		}
		st.ContainerStatuses = append(st.ContainerStatuses, s)
	}
	st.Phase = podPhase(pod.Spec.RestartPolicy, st.ContainerStatuses)
	if st.Phase == corev1.PodSucceeded || st.Phase == corev1.PodFailed {
		// Not over while a sidecar still runs: a terminal phase is final
		// (no later status is taken), and the sidecars' ends are still
		// to be reported, as on a kubelet.
		for _, c := range ps.plan.inits {
			if cs := ps.containers[c.name]; c.sidecar && cs != nil && cs.running {
				st.Phase = corev1.PodRunning
			}
		}
	}
	if ps.reason != "" {
		// A pod that could not be made, or whose sandbox ended, is over
		// whatever its restart policy.
		st.Phase = corev1.PodFailed
	}
	st.Reason, st.Message = "", ""
	if ps.reason != "" {
		st.Reason, st.Message = ps.reason, ps.message
	}
	ready := corev1.ConditionFalse
	if n > 0 && readyN == n {
		ready = corev1.ConditionTrue
	}
	now := metav1.Now()
	st.Conditions = []corev1.PodCondition{
		{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: start},
		{Type: corev1.PodInitialized, Status: condition(initialized), LastTransitionTime: start},
		{Type: corev1.ContainersReady, Status: ready, LastTransitionTime: now},
		{Type: corev1.PodReady, Status: ready, LastTransitionTime: now},
	}
	if ps.sandboxID != "" && ps.reason == "" {
		st.Conditions = append(st.Conditions, networkCondition(ps, now), pauseCondition(ps, now))
		if ps.pz.paused {
			pausedStatus(st, ps.pz.kind)
		}
	}
	return pod
}

func condition(b bool) corev1.ConditionStatus {
	if b {
		return corev1.ConditionTrue
	}
	return corev1.ConditionFalse
}

// renew keeps the deadline of every pod sandbox without an
// activeDeadlineSeconds ahead, until ctx ends.
func (p *Pods) renew(ctx context.Context) {
	t := time.NewTicker(renewEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		p.mu.Lock()
		var ids []string
		for _, ps := range p.pods {
			if ps.sandboxID != "" && ps.reason == "" && !hasDeadline(ps.pod) {
				ids = append(ids, ps.sandboxID)
			}
		}
		p.mu.Unlock()
		for _, id := range ids {
			if err := p.sb.SetTimeout(ctx, id, podLease); err != nil && ctx.Err() == nil {
				p.log.Warn("sandbox_renew_failed", "sandbox_id", id, "err", err)
			}
		}
	}
}

// reconcile takes back the pods a previous run of this node left: each
// live sandbox labelled with this node whose pod still exists (same UID)
// is followed again; the sandboxes of pods gone from the API are
// destroyed.
func (p *Pods) reconcile(ctx context.Context) error {
	sbs, err := p.sb.List(ctx, map[string]string{LabelNode: p.node})
	if err != nil {
		return fmt.Errorf("list sandboxes of node %s: %w", p.node, err)
	}
	for _, sb := range sbs {
		if sb.State != client.StateReady && sb.State != client.StateCreating && sb.State != client.StatePaused {
			continue
		}
		ns, name, uid := sb.Labels[LabelPodNamespace], sb.Labels[LabelPodName], sb.Labels[LabelPodUID]
		pod, err := p.kube.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) || (err == nil && (pod.UID != types.UID(uid) || pod.Spec.NodeName != p.node)) {
			p.log.Info("pod_gone_sandbox_destroyed", "pod", key(ns, name), "sandbox_id", sb.ID)
			if err := p.kill(sb.ID); err != nil {
				return fmt.Errorf("destroy sandbox %s of a deleted pod: %w", sb.ID, err)
			}
			continue
		}
		if err != nil {
			return fmt.Errorf("get pod %s: %w", key(ns, name), err)
		}
		if pod.Annotations[AnnotationLost] != "" {
			// Reported lost while the node was away: the pod fails
			// (CreatePod) and its sandbox does not come back.
			p.log.Info("pod_lost_sandbox_destroyed", "pod", key(ns, name), "sandbox_id", sb.ID)
			if err := p.kill(sb.ID); err != nil {
				return fmt.Errorf("destroy sandbox %s of a lost pod: %w", sb.ID, err)
			}
			continue
		}
		pl, err := planPod(pod, p.node)
		if err != nil {
			// It was made from this pod once; it cannot fail now.
			return fmt.Errorf("pod %s: %w", key(ns, name), err)
		}
		cctx, cancel := context.WithCancel(p.ctx)
		ps := &podState{pod: pod.DeepCopy(), plan: pl, started: sb.CreatedAt, ctx: cctx, cancel: cancel, sandboxID: sb.ID, containers: map[string]*containerState{}}
		if pod.Status.StartTime != nil {
			ps.started = pod.Status.StartTime.Time
		}
		p.mu.Lock()
		p.pods[key(ns, name)] = ps
		p.mu.Unlock()
		if sb.State == client.StatePaused {
			p.readoptPaused(cctx, ps, sb)
		} else if err := p.readopt(cctx, ps, sb); err != nil {
			return err
		}
		// The pause, the deadline and the policy may have moved while the
		// node was away: they are set again (ps.net is not known).
		p.applyPause(cctx, ps)
		p.applyDeadline(cctx, ps)
		p.applyNetwork(cctx, ps)
		p.log.Info("pod_adopted", "pod", key(ns, name), "sandbox_id", sb.ID)
	}
	return nil
}

// readopt finds each container's process again: still running (followed
// again), ended (its exit code read back, and restarted if its pod's
// policy says so), or without a process of its own. Restart counts and
// previous runs are read back from the sandbox.
func (p *Pods) readopt(ctx context.Context, ps *podState, sb *client.Sandbox) error {
	running, err := p.runningByTag(ctx, sb.ID)
	if err != nil {
		return err
	}
	p.adopt(ctx, ps, sb)
	p.syncVolumesEvery(ps, p.syncEvery)
	if len(ps.plan.inits) > 0 && !p.containersBegan(ctx, ps, sb.ID, running) {
		// The node stopped while the init containers ran: they carry on
		// (one that succeeded is not run again), then the containers
		// start.
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.start(ctx, ps, running, time.Time{})
		}()
		return nil
	}
	p.recoverInits(ctx, ps, sb.ID)
	fctx := p.newFollowers(ps)
	started := ps.started
	for _, c := range ps.plan.followed() {
		pid := running[processTag(c.name)]
		cs := &containerState{running: true, startedAt: started}
		if len(c.argv) > 0 {
			p.recoverRuns(ctx, sb.ID, c.name, cs)
		}
		p.mu.Lock()
		ps.containers[c.name] = cs
		p.mu.Unlock()
		switch {
		case len(c.argv) == 0:
		case pid == 0 && p.neverStarted(ctx, sb.ID, c.name):
			// The node stopped between making the sandbox and starting
			// this container: it starts now.
			if err := p.sb.MakeDir(ctx, sb.ID, podDir); err != nil && !errors.Is(err, errdefs.ErrAlreadyExists) {
				p.fail(ps, "BerthStartFailed", fmt.Sprintf("make %s: %v", podDir, err))
				continue
			}
			pid, err := p.startContainer(ctx, ps, c, 0)
			if err != nil {
				p.fail(ps, "BerthStartFailed", fmt.Sprintf("container %s: %v", c.name, err))
				continue
			}
			p.follow(fctx, ps, c, pid)
		default:
			// Still running, or ended while the node was away: its exit
			// code is read back and the restart policy applied.
			p.follow(fctx, ps, c, pid)
		}
	}
	p.mu.Lock()
	ps.up = true
	p.mu.Unlock()
	p.changed(ps)
	return nil
}

// readoptPaused takes back a pod whose sandbox is paused: nothing in it
// answers, so its containers are followed again (and their runs read
// back) once it is resumed.
func (p *Pods) readoptPaused(ctx context.Context, ps *podState, sb *client.Sandbox) {
	p.adopt(ctx, ps, sb)
	p.syncVolumesEvery(ps, p.syncEvery)
	p.mu.Lock()
	for _, c := range ps.plan.followed() {
		ps.containers[c.name] = &containerState{running: true, startedAt: ps.started}
	}
	// The node pauses a pod only once its containers started, after its
	// init containers succeeded; their runs are read back on resume
	// (recoverAllRuns), which finds out too whether the daemon paused it
	// on its own before then.
	ps.initialized, ps.up = true, true
	pz := pauseState{paused: true, value: ps.pod.Annotations[AnnotationPaused], kind: sb.Pause, at: time.Now(), runsUnknown: true}
	p.mu.Unlock()
	if pz.value == "" {
		if ev, ok := p.lastPause(ctx, sb.ID); ok && !strings.HasPrefix(ev.Message, apiPause) {
			// Paused by the daemon on its own (its deadline, idle), not
			// by the annotation: a moved deadline resumes it.
			pz.byDaemon, pz.why, pz.at = true, ev.Message, ev.Time
			pz.deadline = ps.pod.Annotations[AnnotationDeadline]
		} else {
			// The annotation was removed while the node was away:
			// applyPause resumes it.
			pz.value = "unknown"
		}
	}
	p.mu.Lock()
	ps.pz = pz
	p.mu.Unlock()
	p.changed(ps)
}

// apiPause starts the daemon's word for a pause its API was asked for
// (the node's, for the annotation): "paused (memory)"; its own pauses
// say why ("paused at its deadline (…)", "idle for 15m (…)").
const apiPause = "paused ("

// lastPause is the daemon's last EventPaused of sandbox id.
func (p *Pods) lastPause(ctx context.Context, id string) (client.Event, bool) {
	evs, err := p.sb.Events(ctx, id)
	if err != nil {
		p.log.Warn("sandbox_events_failed", "sandbox_id", id, "err", err)
		return client.Event{}, false
	}
	for i := len(evs) - 1; i >= 0; i-- {
		if evs[i].Type == client.EventPaused {
			return evs[i], true
		}
	}
	return client.Event{}, false
}

// limitWriter takes at most n bytes and then fails.
type limitWriter struct {
	w io.Writer
	n int
}

func (l *limitWriter) Write(b []byte) (int, error) {
	if len(b) > l.n {
		return 0, fmt.Errorf("more than the limit: %w", errdefs.ErrResourceExhausted)
	}
	l.n -= len(b)
	return l.w.Write(b)
}
