package node

import (
	"context"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/crilog"
)

// TestSidecars: under a pod whose restartPolicy is Never, sidecars start
// in order before the container, one that ends is started again, and once
// the container completed they are stopped with SIGTERM, the last first,
// and not started again; the pod then Succeeded.
func TestSidecars(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		always := corev1.ContainerRestartPolicyAlways
		pod := testPod()
		pod.Spec.RestartPolicy = corev1.RestartPolicyNever
		pod.Spec.InitContainers = []corev1.Container{
			{Name: "s1", Command: []string{"proxy"}, RestartPolicy: &always},
			{Name: "setup", Command: []string{"true"}},
			{Name: "s2", Command: []string{"agent"}, RestartPolicy: &always},
		}
		f := newTagRunner()
		p, ps := startTagged(t, f, pod, nil)
		status := func() *corev1.Pod { return podNow(p, ps) }

		// s1 runs; setup waits for it, then s2 and main start.
		synctest.Wait()
		if got := f.started(); !slices.Equal(got, []string{"s1", "setup"}) {
			t.Fatalf("started %v, want s1 then setup", got)
		}
		f.exit("setup", 0)
		synctest.Wait()
		if got := f.started(); !slices.Equal(got, []string{"s1", "setup", "s2", "main"}) {
			t.Fatalf("started %v, want s1, setup, s2, main", got)
		}
		pst := status()
		if pst.Status.Phase != corev1.PodRunning || podCondition(pst, corev1.PodReady).Status != corev1.ConditionTrue {
			t.Errorf("phase %s, Ready %s; want Running, True", pst.Status.Phase, podCondition(pst, corev1.PodReady).Status)
		}
		if s := pst.Status.InitContainerStatuses[0]; s.State.Running == nil || !s.Ready || s.Started == nil || !*s.Started {
			t.Errorf("s1 = %+v, want running, started, ready", s)
		}

		// s1 ends: started again at once, though the pod's policy is Never.
		f.exit("s1", 3)
		synctest.Wait()
		if got := f.started(); len(got) != 5 || got[4] != "s1" {
			t.Fatalf("started %v, want s1 again", got)
		}
		if s := status().Status.InitContainerStatuses[0]; s.RestartCount != 1 || s.State.Running == nil {
			t.Errorf("s1 = %+v, want running after 1 restart", s)
		}

		// main completes: s2 then s1 get SIGTERM, and stay ended; s1
		// ignores it, so it is killed once the grace period passed, and
		// the pod is not over until then.
		f.mu.Lock()
		f.stubborn = "s1"
		f.mu.Unlock()
		f.exit("main", 0)
		synctest.Wait()
		if got := f.terminated(); !slices.Equal(got, []string{"s2", "s1"}) {
			t.Errorf("SIGTERM to %v, want s2 then s1", got)
		}
		if pst = status(); pst.Status.Phase != corev1.PodRunning || pst.Status.InitContainerStatuses[0].State.Running == nil {
			t.Errorf("phase %s, s1 %+v; want Running while s1 runs", pst.Status.Phase, pst.Status.InitContainerStatuses[0].State)
		}
		// Inside the synctest bubble: Sleep moves the fake clock past
		// the grace period (no real time passes); Wait lets the node
		// act on it.
		time.Sleep(defaultGrace)
		synctest.Wait()
		pst = status()
		if pst.Status.Phase != corev1.PodSucceeded {
			t.Errorf("phase %s, want Succeeded", pst.Status.Phase)
		}
		for i, code := range map[int]int32{0: 137, 2: 0} {
			if s := pst.Status.InitContainerStatuses[i]; s.State.Terminated == nil || s.State.Terminated.ExitCode != code {
				t.Errorf("%s = %+v, want terminated with %d", s.Name, s.State, code)
			}
		}
		// Past any back-off (fake clock, as above): nothing starts again.
		time.Sleep(time.Minute)
		synctest.Wait()
		if got := f.started(); len(got) != 5 {
			t.Errorf("started %v after the pod completed", got)
		}
	})
}

// TestPauseDuringInits: a sandbox its daemon pauses (filesystem) while an
// init container runs does not fail the pod: it is Pending and paused,
// and once resumed (its deadline moved) the init container runs again as
// its next restart, though the pod's policy is Never, and the containers
// start after it. Also when the pause came so soon after the init
// container's start that its wrapper left no file yet (the node reported
// it running all the same).
func TestPauseDuringInits(t *testing.T) {
	for _, early := range []bool{false, true} {
		t.Run(map[bool]string{false: "running", true: "before its first file"}[early], func(t *testing.T) {
			testPauseDuringInits(t, early)
		})
	}
}

func testPauseDuringInits(t *testing.T, early bool) {
	synctest.Test(t, func(t *testing.T) {
		pod := testPod()
		pod.Spec.RestartPolicy = corev1.RestartPolicyNever
		pod.Annotations = map[string]string{AnnotationDeadline: "2026-12-03T10:00:00Z", AnnotationOnTimeout: "pause"}
		pod.Spec.InitContainers = []corev1.Container{{Name: "setup", Command: []string{"make"}}}
		// As the API server does for a pod under Never: an init container
		// reported terminated may not run again.
		var mu sync.Mutex
		ended, refused := map[string]bool{}, []string{}
		validate := func(pod *corev1.Pod) {
			mu.Lock()
			defer mu.Unlock()
			for _, s := range pod.Status.InitContainerStatuses {
				switch {
				case s.State.Terminated != nil:
					ended[s.Name] = true
				case ended[s.Name]:
					refused = append(refused, s.Name)
				}
			}
		}
		f := newTagRunner()
		f.noFiles = early
		p, ps := startTagged(t, f, pod, validate)
		synctest.Wait()
		if got := f.started(); !slices.Equal(got, []string{"setup"}) {
			t.Fatalf("started %v, want setup", got)
		}

		// The daemon pauses it at its deadline: setup's process ends
		// without an exit code.
		f.pause()
		f.noFiles = false
		synctest.Wait()
		p.pausedByDaemon(t.Context(), ps, "sb", client.Event{Type: client.EventPaused, Time: time.Now(), Message: "paused at its deadline (filesystem)"})
		synctest.Wait()
		got := podNow(p, ps)
		if st, _ := Paused(got); st != "paused" || got.Status.Phase != corev1.PodPending || got.Status.Reason != "" {
			t.Fatalf("paused while initializing: Paused %q, phase %s, reason %q; want paused, Pending, none", st, got.Status.Phase, got.Status.Reason)
		}

		// A moved deadline resumes it: setup runs again.
		moved := ps.pod.DeepCopy()
		moved.Annotations[AnnotationDeadline] = "2026-12-03T11:00:00Z"
		if err := p.UpdatePod(t.Context(), moved); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if got := f.started(); !slices.Equal(got, []string{"setup", "setup"}) {
			t.Fatalf("started %v after the resume, want setup again", got)
		}
		f.exit("setup", 0)
		synctest.Wait()
		if got := f.started(); !slices.Equal(got, []string{"setup", "setup", "main"}) {
			t.Fatalf("started %v, want main after setup", got)
		}
		got = podNow(p, ps)
		s := got.Status.InitContainerStatuses[0]
		if s.State.Terminated == nil || s.State.Terminated.ExitCode != 0 || s.RestartCount != 1 ||
			s.LastTerminationState.Terminated == nil || s.LastTerminationState.Terminated.ExitCode != 137 {
			t.Errorf("setup = %+v, want exit 0 on its second run, the first ended with 137", s)
		}
		if got.Status.Phase != corev1.PodRunning || got.Status.Reason != "" {
			t.Errorf("phase %s, reason %q; want Running", got.Status.Phase, got.Status.Reason)
		}
		mu.Lock()
		defer mu.Unlock()
		if len(refused) > 0 {
			t.Errorf("reported %v terminated, then running again: the API server refuses that under Never", refused)
		}
	})
}

// startTagged is a node with pod on f, its init containers and containers
// started in the background; notify, when set, gets its statuses.
func startTagged(t *testing.T, f *tagRunner, pod *corev1.Pod, notify func(*corev1.Pod)) (*Pods, *podState) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	p := &Pods{ctx: ctx, sb: f, backOff: newBackOff(time.Second, 4*time.Second), log: slog.New(slog.DiscardHandler), pods: map[string]*podState{},
		notify: notify}
	pl, err := planPod(pod, "node")
	if err != nil {
		t.Fatal(err)
	}
	ps := &podState{pod: pod, plan: pl, sandboxID: "sb", ctx: ctx, containers: map[string]*containerState{},
		applied: pod.Annotations[AnnotationDeadline], net: netState{known: true}}
	p.pods[key(pod.Namespace, pod.Name)] = ps
	p.wg.Go(func() { p.start(ctx, ps, nil, time.Time{}) })
	t.Cleanup(func() {
		cancel()
		p.Wait()
	})
	return p, ps
}

func newTagRunner() *tagRunner {
	return &tagRunner{fakeRunner: newFakeRunner(), names: map[uint32]string{}}
}

// tagRunner is fakeRunner with several containers, told apart by their
// processes' tags, whose processes the test ends (exit), a SIGTERM ends
// with 0 (but stubborn's) and the node's kill signal with 137.
type tagRunner struct {
	*fakeRunner
	names map[uint32]string
	order []string
	terms []string
	// stubborn is the container that ignores SIGTERM.
	stubborn string
	// paused: a filesystem pause ended every process without an exit
	// code.
	paused bool
	// noFiles: a started process's wrapper has written no file yet (its
	// run record).
	noFiles bool
}

// pause is the daemon's filesystem pause: every process ends, none
// leaves an exit code.
func (f *tagRunner) pause() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.paused = true
	for _, done := range f.procs {
		select {
		case <-done:
		default:
			close(done)
		}
	}
}

func (f *tagRunner) Resume(context.Context, string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.paused {
		return errdefs.ErrFailedPrecondition
	}
	f.paused = false
	return nil
}

func (f *tagRunner) Get(context.Context, string) (*client.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	st := client.StateReady
	if f.paused {
		st = client.StatePaused
	}
	return &client.Sandbox{Sandbox: types.Sandbox{State: st, Pause: "filesystem"}}, nil
}

func (f *tagRunner) Processes(context.Context, string) ([]client.ProcessInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []client.ProcessInfo
	for pid, done := range f.procs {
		select {
		case <-done:
		default:
			out = append(out, client.ProcessInfo{PID: pid, Tag: processTag(f.names[pid])})
		}
	}
	return out, nil
}

func (f *tagRunner) SetTimeout(context.Context, string, time.Duration) error { return nil }

func (f *tagRunner) Start(_ context.Context, _ string, req client.ExecRequest) (uint32, error) {
	name, ok := strings.CutPrefix(req.Tag, "berth-pod/")
	i := slices.Index(req.Args, "-restart")
	if !ok || i < 0 {
		return 0, errdefs.ErrInvalidArgument
	}
	restart, err := strconv.Atoi(req.Args[i+1])
	if err != nil {
		return 0, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.order = append(f.order, name)
	if !f.noFiles {
		f.files[runPath(name)] = string(crilog.Run{Restart: restart, Started: time.Now()}.Append(nil))
	}
	delete(f.files, exitPath(name))
	f.pid++
	f.procs[f.pid] = make(chan struct{})
	f.names[f.pid] = name
	return f.pid, nil
}

func (f *tagRunner) Signal(_ context.Context, _ string, pid uint32, sig int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch sig {
	case int(syscall.SIGTERM):
		f.terms = append(f.terms, f.names[pid])
		if f.names[pid] != f.stubborn {
			f.endLocked(pid, 0)
		}
	case int(killSignal):
		f.endLocked(pid, 137)
	}
	return nil
}

// exit ends container name's current process with code.
func (f *tagRunner) exit(name string, code int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for pid, n := range f.names {
		if n == name {
			f.endLocked(pid, code)
		}
	}
}

func (f *tagRunner) endLocked(pid uint32, code int) {
	select {
	case <-f.procs[pid]:
		return
	default:
	}
	f.files[exitPath(f.names[pid])] = strconv.Itoa(code) + "\n"
	close(f.procs[pid])
}

// Exec is the wrapper's rotation before a restart.
func (f *tagRunner) Exec(context.Context, string, client.ExecRequest) (int, error) { return 0, nil }

func (f *tagRunner) started() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.order)
}

func (f *tagRunner) terminated() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.terms)
}
