package node

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8stypes "k8s.io/apimachinery/pkg/types"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/errdefs"
)

// healthyDaemon is a daemon that answers health ok and has no templates.
type healthyDaemon struct{ Sandboxes }

func (healthyDaemon) Health(context.Context) (*client.Health, error) {
	return &client.Health{Status: "ok"}, nil
}

func (healthyDaemon) Templates(context.Context) ([]client.Template, error) { return nil, nil }

// requesting is testPod named name, requesting cpu (and as much as its
// limit of memory).
func requesting(name, cpu string) *corev1.Pod {
	pod := testPod()
	pod.Name, pod.UID = name, k8stypes.UID("uid-"+name)
	c := &pod.Spec.Containers[0]
	c.Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse("256Mi")}
	return pod
}

// TestPausedPodsGiveRoom: a paused pod's requests are room the node gives
// back (pausedRoom, and the onRoom call that moves the allocatable); a
// resume that does not fit beside the running pods waits, refused with
// resource_exhausted, and happens once a pod of the node is deleted; a
// pause asked again meanwhile ends the wait; a new pod that does not fit
// fails as a kubelet's would (OutOfcpu).
func TestPausedPodsGiveRoom(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &pausingRunner{fakeRunner: newFakeRunner(), kind: "memory", ended: map[uint32]bool{}}
		p, a := newPausePods(t, f)
		ctx := t.Context()
		var moved atomic.Int32
		p.mu.Lock()
		p.node = "node"
		p.alloc = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2"), corev1.ResourceMemory: resource.MustParse("4Gi")}
		p.onRoom = func() { moved.Add(1) }
		p.roomKick = make(chan struct{}, 1)
		a.pod = requesting(a.pod.Name, "1500m")
		p.mu.Unlock()
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.roomLoop()
		}()

		if room := p.pausedRoom(); len(room) != 0 {
			t.Errorf("room given back while all run: %v", room)
		}
		if err := p.UpdatePod(ctx, withPaused(a.pod, "one")); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if room := p.pausedRoom(); room.Cpu().MilliValue() != 1500 || room.Memory().Value() != 256<<20 {
			t.Errorf("room given back by the paused pod = %v, want cpu 1500m, memory 256Mi", room)
		}
		if moved.Load() == 0 {
			t.Error("the pause did not move the node's allocatable")
		}

		// Another pod takes the room the paused one gave back.
		bctx, bcancel := context.WithCancel(ctx)
		b := &podState{pod: requesting("b", "1500m"), ctx: bctx, cancel: bcancel, containers: map[string]*containerState{}}
		if pl, err := planPod(b.pod, "node"); err == nil {
			b.plan = pl
		} else {
			t.Fatal(err)
		}
		p.mu.Lock()
		p.pods[key(b.pod.Namespace, b.pod.Name)] = b
		p.mu.Unlock()

		// A third does not fit beside it: refused as a kubelet refuses.
		c := requesting("c", "1")
		if err := p.CreatePod(ctx, c); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		cp, err := p.GetPod(ctx, c.Namespace, c.Name)
		if err != nil || cp.Status.Phase != corev1.PodFailed || cp.Status.Reason != "OutOfcpu" ||
			!strings.Contains(cp.Status.Message, "cpu: requested 1, used 1500m of 2 allocatable") {
			t.Fatalf("a pod that does not fit: %v %s %q", err, cp.Status.Phase, cp.Status.Message)
		}

		// The resume waits for room.
		resume := func() {
			t.Helper()
			p.mu.Lock()
			pod := a.pod
			p.mu.Unlock()
			if err := p.UpdatePod(ctx, withPaused(pod, "")); err != nil {
				t.Fatal(err)
			}
			synctest.Wait()
		}
		resume()
		pod := podNow(p, a)
		done, err := PauseStatus(pod, "")
		if !done || !errors.Is(err, errdefs.ErrResourceExhausted) || !strings.Contains(err.Error(), "no room to resume") {
			t.Fatalf("resume without room: PauseStatus = %v, %v", done, err)
		}
		if st, _ := Paused(pod); st != "paused" || f.resumes != 0 {
			t.Errorf("resume without room: Paused = %q, %d resumes", st, f.resumes)
		}
		if room := p.pausedRoom(); room.Cpu().MilliValue() != 1500 {
			t.Errorf("a waiting resume took the room back: %v", room)
		}

		// Paused again: it waits no more, and b's end does not resume it.
		p.mu.Lock()
		pod = a.pod
		p.mu.Unlock()
		if err := p.UpdatePod(ctx, withPaused(pod, "two")); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if done, err := PauseStatus(podNow(p, a), "two"); !done || err != nil {
			t.Fatalf("paused again: PauseStatus = %v, %v", done, err)
		}
		resume()
		if _, err := PauseStatus(podNow(p, a), ""); !errors.Is(err, errdefs.ErrResourceExhausted) {
			t.Fatalf("resumed again without room: %v", err)
		}

		// b goes: the waiting resume takes its room.
		before := moved.Load()
		if err := p.DeletePod(ctx, b.pod); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if done, err := PauseStatus(podNow(p, a), ""); !done || err != nil || f.resumes != 1 {
			t.Fatalf("after b went: PauseStatus = %v, %v; %d resumes", done, err, f.resumes)
		}
		if room := p.pausedRoom(); len(room) != 0 || moved.Load() == before {
			t.Errorf("after the resume: room given back %v, allocatable moved %v", room, moved.Load() != before)
		}
	})
}

// TestNodeAllocatable: the node reports its allocatable less its warm
// pods and plus its paused pods' room, and a change of that room alone
// is reported.
func TestNodeAllocatable(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2"), corev1.ResourceMemory: resource.MustParse("4Gi"), corev1.ResourcePods: resource.MustParse("10")}
		var room atomic.Pointer[corev1.ResourceList]
		none := corev1.ResourceList{}
		room.Store(&none)
		s := &nodeStatus{sb: healthyDaemon{}, log: slog.New(slog.DiscardHandler), base: &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}, Status: corev1.NodeStatus{Allocatable: base}},
			poke: make(chan struct{}, 1), room: func() corev1.ResourceList { return *room.Load() }}
		got := make(chan corev1.ResourceList, 8)
		s.NotifyNodeStatus(t.Context(), func(n *corev1.Node) { got <- n.Status.Allocatable })
		go s.run(t.Context(), time.Hour)
		synctest.Wait()
		first := <-got
		if first.Cpu().Cmp(resource.MustParse("2")) != 0 {
			t.Errorf("allocatable = %v", first)
		}
		paused := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1500m"), corev1.ResourceMemory: resource.MustParse("1Gi")}
		room.Store(&paused)
		s.refresh()
		synctest.Wait()
		select {
		case a := <-got:
			if a.Cpu().MilliValue() != 3500 || a.Memory().Value() != 5<<30 || a.Pods().Value() != 10 {
				t.Errorf("allocatable with a paused pod = %v", a)
			}
		default:
			t.Fatal("a change of the paused room was not reported")
		}
		s.refresh()
		synctest.Wait()
		select {
		case a := <-got:
			t.Errorf("reported again without a change: %v", a)
		default:
		}
	})
}

// templatesDaemon is a healthy daemon with templates.
type templatesDaemon struct {
	healthyDaemon
	tpls []client.Template
}

func (d templatesDaemon) Templates(context.Context) ([]client.Template, error) { return d.tpls, nil }

// TestNodeTemplateAnnotations: the node reports its daemon's templates,
// when each built one was built and which build it has; the gateway reads
// them back.
func TestNodeTemplateAnnotations(t *testing.T) {
	at := time.Date(2026, 12, 4, 10, 0, 0, 0, time.UTC)
	d := templatesDaemon{tpls: []client.Template{
		{Name: "py", Built: true, BuiltAt: at, BuildID: "0123456789abcdef0123456789abcdef"},
		{Name: "base"},
		{Name: "old", Built: true, BuiltAt: at.Add(-time.Hour)},
	}}
	s := &nodeStatus{sb: d}
	got, err := s.templates(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Annotations: got.annotations()}}
	if n.Annotations[AnnotationTemplates] != "base,old,py" {
		t.Errorf("templates annotation %q", n.Annotations[AnnotationTemplates])
	}
	if id, ok := TemplateBuildID(n, "py"); !ok || id != "0123456789abcdef0123456789abcdef" {
		t.Errorf("py's build = %q, %v", id, ok)
	}
	for _, name := range []string{"old", "base", "nope"} {
		if id, ok := TemplateBuildID(n, name); ok {
			t.Errorf("%s's build = %q, want none said", name, id)
		}
	}
	if when, ok := TemplateBuiltAt(n, "old"); !ok || !when.Equal(at.Add(-time.Hour)) {
		t.Errorf("old built at %v, %v", when, ok)
	}
}
