package node

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/crilog"
)

// TestRestartLoop: a container under OnFailure that exits 1 is started
// again at once, then after the back-off (CrashLoopBackOff meanwhile),
// its previous run's files kept before each restart is reported; once it
// exits 0 it stays ended and the pod succeeds. Under Never it is not
// restarted.
func TestRestartLoop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f, p, ps := newRestartPods(t, corev1.RestartPolicyOnFailure)
		status := func() (corev1.PodPhase, corev1.ContainerStatus) {
			p.mu.Lock()
			defer p.mu.Unlock()
			pod := p.withStatus(ps)
			return pod.Status.Phase, pod.Status.ContainerStatuses[0]
		}

		f.exit(1)
		synctest.Wait()
		// The first restart is at once, with the run that ended as the
		// last state and its files kept as the previous run's.
		phase, cs := status()
		if phase != corev1.PodRunning || cs.State.Running == nil || cs.RestartCount != 1 {
			t.Fatalf("after the first exit: %s, %+v; want running, restart count 1", phase, cs)
		}
		if lt := cs.LastTerminationState.Terminated; lt == nil || lt.ExitCode != 1 || lt.Reason != reasonError {
			t.Errorf("last state = %+v, want exit 1, Error", lt)
		}
		if got := f.file(logPath("main") + crilog.Previous); got != "run 0\n" {
			t.Errorf("previous log = %q, want run 0's", got)
		}
		if got := f.starts(); !slices.Equal(got, []int{0, 1}) {
			t.Errorf("runs started = %v, want 0 and 1", got)
		}

		f.exit(1)
		synctest.Wait()
		phase, cs = status()
		if phase != corev1.PodRunning || cs.State.Waiting == nil || cs.State.Waiting.Reason != reasonCrashLoopBackOff || cs.RestartCount != 1 {
			t.Fatalf("after the second exit: %s, %+v; want waiting in CrashLoopBackOff, restart count 1", phase, cs)
		}
		if !strings.Contains(cs.State.Waiting.Message, "back-off 1s restarting failed container=main") {
			t.Errorf("waiting message = %q", cs.State.Waiting.Message)
		}
		// Inside the synctest bubble: Sleep advances the fake clock to
		// just before the back-off ends (no real time passes), and Wait
		// lets the restart loop act on it.
		time.Sleep(time.Second - time.Millisecond)
		synctest.Wait()
		if got := f.starts(); len(got) != 2 {
			t.Fatalf("restarted before the back-off passed: runs %v", got)
		}
		time.Sleep(time.Millisecond)
		synctest.Wait()
		phase, cs = status()
		if phase != corev1.PodRunning || cs.State.Running == nil || cs.RestartCount != 2 {
			t.Fatalf("after the back-off: %s, %+v; want running, restart count 2", phase, cs)
		}
		if got := f.file(logPath("main") + crilog.Previous); got != "run 1\n" {
			t.Errorf("previous log = %q, want run 1's", got)
		}

		f.exit(0)
		synctest.Wait()
		phase, cs = status()
		if phase != corev1.PodSucceeded || cs.State.Terminated == nil || cs.State.Terminated.ExitCode != 0 || cs.RestartCount != 2 {
			t.Errorf("after exit 0: %s, %+v; want Succeeded, terminated with 0, restart count 2", phase, cs)
		}
		if got := f.starts(); len(got) != 3 {
			t.Errorf("runs started = %v, want 3", got)
		}
	})
	t.Run("never", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			f, p, ps := newRestartPods(t, corev1.RestartPolicyNever)
			f.exit(1)
			synctest.Wait()
			p.mu.Lock()
			pod := p.withStatus(ps)
			p.mu.Unlock()
			if cs := pod.Status.ContainerStatuses[0]; pod.Status.Phase != corev1.PodFailed || cs.State.Terminated == nil || cs.RestartCount != 0 {
				t.Errorf("after exit 1: %s, %+v; want Failed, terminated, no restart", pod.Status.Phase, cs)
			}
			if got := f.starts(); len(got) != 1 {
				t.Errorf("runs started = %v, want only the first", got)
			}
		})
	})
}

// TestBackOffResets: a run that lasted the reset time is restarted at
// once, however many restarts came before.
func TestBackOffResets(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f, p, ps := newRestartPods(t, corev1.RestartPolicyAlways)
		f.exit(0) // restarted at once
		synctest.Wait()
		f.exit(0) // backs off 1 s
		synctest.Wait()
		// Fake clock (synctest): the 1 s back-off passes, then a run as
		// long as the reset period.
		time.Sleep(time.Second)
		synctest.Wait()
		time.Sleep(p.backOff.reset)
		f.exit(0) // ran long enough: at once again
		synctest.Wait()
		p.mu.Lock()
		cs := p.withStatus(ps).Status.ContainerStatuses[0]
		p.mu.Unlock()
		if cs.State.Running == nil || cs.RestartCount != 3 {
			t.Errorf("after a long run: %+v, want running again at once, restart count 3", cs)
		}
	})
}

// TestRecoverRuns: a restarted node reads a container's restart count,
// start time and previous run back from the sandbox.
func TestRecoverRuns(t *testing.T) {
	t0 := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	f := newFakeRunner()
	p := &Pods{sb: f, log: slog.New(slog.DiscardHandler)}
	f.files[runPath("main")] = string(crilog.Run{Restart: 4, Started: t0.Add(time.Minute)}.Append(nil))
	f.files[runPath("main")+crilog.Previous] = string(crilog.Run{Restart: 3, Started: t0}.Append(nil))
	f.files[exitPath("main")+crilog.Previous] = "2\n"
	f.mtime = t0.Add(30 * time.Second)
	cs := &containerState{running: true}
	p.recoverRuns(t.Context(), "sb", "main", cs)
	if cs.restarts != 4 || !cs.startedAt.Equal(t0.Add(time.Minute)) {
		t.Errorf("recovered restarts %d, started %s; want 4, %s", cs.restarts, cs.startedAt, t0.Add(time.Minute))
	}
	if cs.last == nil || cs.last.exitCode != 2 || !cs.last.startedAt.Equal(t0) || !cs.last.finishedAt.Equal(t0.Add(30*time.Second)) {
		t.Errorf("recovered last run = %+v", cs.last)
	}

	// A container an older node started has no run files.
	cs = &containerState{running: true, startedAt: t0}
	p.recoverRuns(t.Context(), "sb", "other", cs)
	if cs.restarts != 0 || cs.last != nil || !cs.startedAt.Equal(t0) {
		t.Errorf("without run files: %+v", cs)
	}
}

// newRestartPods is a node with one pod under policy whose container
// "main" was started (run 0) and is followed, in f, with a back-off of
// 1 s up to 4 s.
func newRestartPods(t *testing.T, policy corev1.RestartPolicy) (*fakeRunner, *Pods, *podState) {
	t.Helper()
	f := newFakeRunner()
	pod := testPod()
	pod.Spec.RestartPolicy = policy
	p, ps := startFollowed(t, f, pod, nil)
	return f, p, ps
}

// startFollowed is a node on sb with pod's first container started (run
// 0) and followed, with a back-off of 1 s up to 4 s; notify, when set,
// gets the pod's statuses.
func startFollowed(t *testing.T, sb Sandboxes, pod *corev1.Pod, notify func(*corev1.Pod)) (*Pods, *podState) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	p := &Pods{ctx: ctx, sb: sb, backOff: newBackOff(time.Second, 4*time.Second), log: slog.New(slog.DiscardHandler), pods: map[string]*podState{}}
	if notify != nil {
		p.NotifyPods(ctx, notify)
	}
	t.Cleanup(func() {
		cancel()
		p.Wait()
	})
	ps := &podState{pod: pod, sandboxID: "sb", containers: map[string]*containerState{}}
	pl, err := planPod(pod, "node")
	if err != nil {
		t.Fatal(err)
	}
	ps.plan = pl
	p.pods[key(pod.Namespace, pod.Name)] = ps
	pid, err := p.startContainer(ctx, ps, pl.containers[0], 0)
	if err != nil {
		t.Fatal(err)
	}
	p.follow(ctx, ps, pl.containers[0], pid)
	return p, ps
}

// fakeRunner is a sandbox whose container processes the test ends: Start
// runs the podlog wrapper's part (the run file, a log line), exit ends
// the current process with a code, Exec runs the wrapper's rotation.
type fakeRunner struct {
	Sandboxes
	mu    sync.Mutex
	files map[string]string
	mtime time.Time
	runs  []int
	procs map[uint32]chan struct{}
	pid   uint32
}

func newFakeRunner() *fakeRunner {
	return &fakeRunner{files: map[string]string{}, procs: map[uint32]chan struct{}{}}
}

func (f *fakeRunner) Start(_ context.Context, _ string, req client.ExecRequest) (uint32, error) {
	i := slices.Index(req.Args, "-restart")
	if req.Cmd != agentPath || i < 0 {
		return 0, errdefs.ErrInvalidArgument
	}
	restart, err := strconv.Atoi(req.Args[i+1])
	if err != nil {
		return 0, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.runs = append(f.runs, restart)
	f.files[runPath("main")] = string(crilog.Run{Restart: restart, Started: time.Now()}.Append(nil))
	f.files[logPath("main")] = "run " + strconv.Itoa(restart) + "\n"
	f.pid++
	f.procs[f.pid] = make(chan struct{})
	return f.pid, nil
}

func (f *fakeRunner) Attach(ctx context.Context, _ string, pid uint32) (int, error) {
	f.mu.Lock()
	done := f.procs[pid]
	f.mu.Unlock()
	select {
	case <-done:
		return 0, nil
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

// exit ends the current process with code.
func (f *fakeRunner) exit(code int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.files[exitPath("main")] = strconv.Itoa(code) + "\n"
	close(f.procs[f.pid])
}

func (f *fakeRunner) Exec(_ context.Context, _ string, req client.ExecRequest) (int, error) {
	if !slices.Equal(append([]string{req.Cmd}, req.Args...), append([]string{agentPath}, rotateArgvArgs()...)) {
		return 0, errdefs.ErrInvalidArgument
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, p := range []string{exitPath("main"), logPath("main"), runPath("main")} {
		if b, ok := f.files[p]; ok {
			f.files[p+crilog.Previous] = b
			delete(f.files, p)
		}
	}
	return 0, nil
}

func rotateArgvArgs() []string {
	_, args := rotateArgv("main")
	return args
}

func (f *fakeRunner) ReadFile(_ context.Context, _, path string, w io.Writer) error {
	f.mu.Lock()
	b, ok := f.files[path]
	f.mu.Unlock()
	if !ok {
		return errdefs.ErrNotFound
	}
	_, err := io.WriteString(w, b)
	return err
}

func (f *fakeRunner) Stat(_ context.Context, _, path string) (client.EntryInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, ok := f.files[path]
	if !ok {
		return client.EntryInfo{}, errdefs.ErrNotFound
	}
	mt := f.mtime
	if mt.IsZero() {
		mt = time.Now()
	}
	return client.EntryInfo{Path: path, Size: int64(len(b)), ModTime: mt}, nil
}

func (f *fakeRunner) file(path string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.files[path]
}

func (f *fakeRunner) starts() []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.runs)
}

// TestNeverStarted: a container whose sandbox holds no log, run record
// or exit code never started (the node stopped before it could).
func TestNeverStarted(t *testing.T) {
	f := newFakeRunner()
	p := &Pods{sb: f, log: slog.New(slog.DiscardHandler)}
	if !p.neverStarted(t.Context(), "sb", "main") {
		t.Errorf("no files: neverStarted = false, want true")
	}
	for _, path := range []string{logPath("main"), runPath("main"), exitPath("main")} {
		f.files = map[string]string{path: ""}
		if p.neverStarted(t.Context(), "sb", "main") {
			t.Errorf("with %s: neverStarted = true, want false", path)
		}
	}
}

// snapRunner is fakeRunner as a daemon that makes the pod's sandbox "sb"
// from a snapshot, with the processes a memory snapshot brought back.
type snapRunner struct {
	*fakeRunner
	snapshot chan string
	restored []client.ProcessInfo
}

func (s *snapRunner) Create(_ context.Context, req client.CreateRequest) (*client.Sandbox, error) {
	s.snapshot <- req.Snapshot
	return &client.Sandbox{Sandbox: types.Sandbox{ID: "sb", State: client.StateReady}}, nil
}

func (s *snapRunner) Get(context.Context, string) (*client.Sandbox, error) {
	return &client.Sandbox{Sandbox: types.Sandbox{ID: "sb", State: client.StateReady}}, nil
}

func (s *snapRunner) FollowEvents(ctx context.Context, _ string, _ func(client.Event) error) error {
	<-ctx.Done()
	return ctx.Err()
}

func (s *snapRunner) MakeDir(context.Context, string, string) error { return nil }

func (s *snapRunner) SetTimeout(context.Context, string, time.Duration) error { return nil }

func (s *snapRunner) Processes(context.Context, string) ([]client.ProcessInfo, error) {
	return s.restored, nil
}

// TestRunFromSnapshot: a pod with the snapshot annotation has its sandbox
// made from that snapshot; a container whose tagged process came back
// with it (a memory snapshot) is followed in that process, not started;
// one whose process did not (a filesystem snapshot) starts as its first
// run.
func TestRunFromSnapshot(t *testing.T) {
	for _, tc := range []struct {
		name     string
		restored []client.ProcessInfo
		starts   []int
	}{
		{"memory", []client.ProcessInfo{{PID: 7, Tag: processTag("main")}, {PID: 9}}, nil},
		{"filesystem", nil, []int{0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &snapRunner{fakeRunner: newFakeRunner(), snapshot: make(chan string, 1), restored: tc.restored}
			f.procs[7] = make(chan struct{})
			ctx, cancel := context.WithCancel(t.Context())
			p := &Pods{ctx: ctx, node: "node", sb: f, backOff: newBackOff(time.Second, 4*time.Second), log: slog.New(slog.DiscardHandler), pods: map[string]*podState{}}
			running := make(chan struct{}, 8)
			p.NotifyPods(ctx, func(pod *corev1.Pod) {
				if pod.Status.Reason != "" {
					t.Errorf("pod failed: %s: %s", pod.Status.Reason, pod.Status.Message)
				}
				if cs := pod.Status.ContainerStatuses; len(cs) == 1 && cs[0].State.Running != nil {
					running <- struct{}{}
				}
			})
			t.Cleanup(func() {
				cancel()
				p.Wait()
			})
			pod := testPod()
			pod.Annotations = map[string]string{AnnotationSnapshot: "snap1"}
			if err := p.CreatePod(ctx, pod); err != nil {
				t.Fatal(err)
			}
			if got := <-f.snapshot; got != "snap1" {
				t.Errorf("sandbox made from snapshot %q, want snap1", got)
			}
			<-running
			if got := f.starts(); !slices.Equal(got, tc.starts) {
				t.Errorf("runs started %v, want %v", got, tc.starts)
			}
		})
	}
}
