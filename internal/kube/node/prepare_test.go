package node

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/errdefs"
)

// prepRunner is tagRunner with the calls a pod's run makes before its
// processes start. While paused, writes into the sandbox are refused, as
// the daemon refuses them.
type prepRunner struct {
	*tagRunner
	wrote []string
	// failDir, when set, fails every MakeDir, paused or not.
	failDir error
	// refusedWrite gets the path of each write refused while paused.
	refusedWrite chan string
}

func (f *prepRunner) Create(context.Context, client.CreateRequest) (*client.Sandbox, error) {
	return &client.Sandbox{Sandbox: types.Sandbox{ID: "sb", State: client.StateReady}}, nil
}

func (f *prepRunner) Get(ctx context.Context, id string) (*client.Sandbox, error) {
	sb, err := f.tagRunner.Get(ctx, id)
	if err == nil {
		sb.ID = "sb"
	}
	return sb, err
}

func (f *prepRunner) FollowEvents(ctx context.Context, _ string, _ func(client.Event) error) error {
	<-ctx.Done()
	return ctx.Err()
}

func (f *prepRunner) SetNetworkPolicy(context.Context, string, client.NetworkPolicy) error {
	return nil
}

func (f *prepRunner) refused() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.paused {
		return fmt.Errorf("sandbox sb is paused: %w", errdefs.ErrFailedPrecondition)
	}
	return nil
}

func (f *prepRunner) MakeDir(context.Context, string, string) error {
	if f.failDir != nil {
		return f.failDir
	}
	return f.refused()
}

func (f *prepRunner) WriteFile(_ context.Context, _, path string, r io.Reader) error {
	if err := f.refused(); err != nil {
		select {
		case f.refusedWrite <- path:
		default:
		}
		return err
	}
	b, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.files[path] = string(b)
	f.wrote = append(f.wrote, path)
	return nil
}

func (f *prepRunner) Exec(context.Context, string, client.ExecRequest) (int, error) {
	return 0, f.refused()
}

// startPrep is a node on f with pod created (its sandbox made and being
// readied in the background) and the pod's state.
func startPrep(t *testing.T, f *prepRunner, kube *fake.Clientset, pod *corev1.Pod) (*Pods, *podState) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	p := &Pods{ctx: ctx, node: "node", sb: f, kube: kube, backOff: newBackOff(time.Second, 4*time.Second), log: slog.New(slog.DiscardHandler), pods: map[string]*podState{}}
	t.Cleanup(func() {
		cancel()
		p.Wait()
	})
	if err := p.CreatePod(ctx, pod); err != nil {
		t.Fatal(err)
	}
	synctest.Wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	return p, p.pods[key(pod.Namespace, pod.Name)]
}

// TestPauseBeforeStart: the daemon pauses a pod's sandbox (its deadline
// under on-timeout pause) while the pod waits for a ConfigMap its volume
// needs, before any process started. The ConfigMap appears meanwhile: the
// pod does not fail on the refused writes; it stays Pending, paused, with
// nothing started. A moved deadline resumes it: the volume is filled and
// the container starts.
func TestPauseBeforeStart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &prepRunner{tagRunner: newTagRunner(), refusedWrite: make(chan string, 1)}
		kube := fake.NewClientset()
		ctx := t.Context()
		pod := testPod()
		pod.Annotations = map[string]string{AnnotationDeadline: "2026-12-03T10:00:00Z", AnnotationOnTimeout: "pause"}
		pod.Spec.Volumes = []corev1.Volume{{Name: "conf", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
			LocalObjectReference: corev1.LocalObjectReference{Name: "settings"}}}}}
		pod.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "conf", MountPath: "/etc/app"}}
		p, ps := startPrep(t, f, kube, pod)

		// Paused by the daemon while the ConfigMap is missing; then the
		// ConfigMap appears.
		f.pause()
		p.pausedByDaemon(ctx, ps, "sb", client.Event{Type: client.EventPaused, Time: time.Now(), Message: "paused at its deadline (filesystem)"})
		if _, err := kube.CoreV1().ConfigMaps(pod.Namespace).Create(ctx, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: "settings"}, Data: map[string]string{"mode": "fast"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		// The node's next try (after its retry wait, on the bubble's
		// clock) writes the file and is refused.
		<-f.refusedWrite
		synctest.Wait()
		got := podNow(p, ps)
		if st, _ := Paused(got); st != "paused" || got.Status.Phase != corev1.PodPending || got.Status.Reason != "" {
			t.Fatalf("paused before its start: Paused %q, phase %s, reason %q (%s); want paused, Pending, none",
				st, got.Status.Phase, got.Status.Reason, got.Status.Message)
		}
		if s := f.started(); len(s) != 0 {
			t.Fatalf("started %v while paused", s)
		}

		// A moved deadline resumes it: the volume is filled, main starts.
		moved := ps.pod.DeepCopy()
		moved.Annotations[AnnotationDeadline] = "2026-12-03T11:00:00Z"
		if err := p.UpdatePod(ctx, moved); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if s := f.started(); !slices.Equal(s, []string{"main"}) {
			t.Fatalf("started %v after the resume, want main", s)
		}
		f.mu.Lock()
		filled := slices.ContainsFunc(f.wrote, func(p string) bool { return strings.HasSuffix(p, "/mode") && f.files[p] == "fast" })
		wrote := slices.Clone(f.wrote)
		f.mu.Unlock()
		if !filled {
			t.Errorf("the volume's file mode was not written after the resume: wrote %v", wrote)
		}
		if got := podNow(p, ps); got.Status.Phase != corev1.PodRunning || got.Status.Reason != "" {
			t.Errorf("after the resume: phase %s, reason %q (%s); want Running", got.Status.Phase, got.Status.Reason, got.Status.Message)
		}
	})
}

// TestPrepareFails: a step that fails while the sandbox runs (not paused)
// fails the pod with the step's error, once; it is not tried again.
func TestPrepareFails(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &prepRunner{tagRunner: newTagRunner(), failDir: fmt.Errorf("no space left on device: %w", errdefs.ErrResourceExhausted)}
		p, ps := startPrep(t, f, fake.NewClientset(), testPod())
		got := podNow(p, ps)
		if got.Status.Phase != corev1.PodFailed || got.Status.Reason != "BerthStartFailed" || !strings.Contains(got.Status.Message, "no space left") {
			t.Errorf("phase %s, reason %q (%s); want Failed, BerthStartFailed naming the error", got.Status.Phase, got.Status.Reason, got.Status.Message)
		}
		if s := f.started(); len(s) != 0 {
			t.Errorf("started %v", s)
		}
	})
}
