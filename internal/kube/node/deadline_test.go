package node

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/client"
)

// lifeRecorder is a daemon that records deadline settings and kills.
type lifeRecorder struct {
	Sandboxes
	timeouts chan time.Duration
	kills    chan string
}

func (r *lifeRecorder) SetTimeout(_ context.Context, _ string, d time.Duration) error {
	r.timeouts <- d
	return nil
}

func (r *lifeRecorder) Kill(_ context.Context, id string) error {
	r.kills <- id
	return nil
}

func (r *lifeRecorder) Get(context.Context, string) (*client.Sandbox, error) {
	return &client.Sandbox{}, nil
}

// TestUpdatePodDeadlineAndLost: a moved deadline annotation becomes the
// sandbox's deadline (once per value); the lost annotation fails the pod
// with NodeLost and destroys its sandbox.
func TestUpdatePodDeadlineAndLost(t *testing.T) {
	rec := &lifeRecorder{timeouts: make(chan time.Duration, 4), kills: make(chan string, 4)}
	ctx, cancel := context.WithCancel(t.Context())
	p := &Pods{ctx: ctx, sb: rec, log: slog.New(slog.DiscardHandler), pods: map[string]*podState{}}
	t.Cleanup(func() {
		cancel()
		p.Wait()
	})
	pod := testPod()
	pod.Annotations = map[string]string{AnnotationDeadline: time.Now().Add(time.Minute).UTC().Format(time.RFC3339)}
	pl, err := planPod(pod, "node")
	if err != nil {
		t.Fatal(err)
	}
	_, pcancel := context.WithCancel(ctx)
	ps := &podState{pod: pod.DeepCopy(), plan: pl, sandboxID: "sb", cancel: pcancel, containers: map[string]*containerState{},
		applied: pod.Annotations[AnnotationDeadline]}
	p.pods[key(pod.Namespace, pod.Name)] = ps
	wait := func(what string) time.Duration {
		t.Helper()
		select {
		case d := <-rec.timeouts:
			return d
		case <-time.After(time.Minute):
			t.Fatalf("no %s", what)
		}
		return 0
	}

	moved := pod.DeepCopy()
	moved.Annotations[AnnotationDeadline] = time.Now().Add(2 * time.Hour).UTC().Format(time.RFC3339)
	if err := p.UpdatePod(ctx, moved); err != nil {
		t.Fatal(err)
	}
	if d := wait("deadline set"); d <= time.Hour || d > 2*time.Hour {
		t.Errorf("timeout set to %s, want about 2h", d)
	}
	p.Wait()
	p.mu.Lock()
	applied := ps.applied
	p.mu.Unlock()
	if applied != moved.Annotations[AnnotationDeadline] {
		t.Errorf("applied = %q, want %q", applied, moved.Annotations[AnnotationDeadline])
	}
	// The same deadline again (a label changed) sets nothing.
	same := moved.DeepCopy()
	same.Labels = map[string]string{"x": "y"}
	if err := p.UpdatePod(ctx, same); err != nil {
		t.Fatal(err)
	}
	p.Wait()
	select {
	case d := <-rec.timeouts:
		t.Errorf("unchanged deadline set again: %s", d)
	default:
	}

	lost := same.DeepCopy()
	lost.Annotations[AnnotationLost] = "node n lost"
	if err := p.UpdatePod(ctx, lost); err != nil {
		t.Fatal(err)
	}
	select {
	case id := <-rec.kills:
		if id != "sb" {
			t.Errorf("killed %q, want sb", id)
		}
	case <-time.After(time.Minute):
		t.Fatal("lost pod's sandbox not destroyed")
	}
	p.Wait()
	got, err := p.GetPod(ctx, pod.Namespace, pod.Name)
	if err != nil {
		t.Fatal(err)
	}
	if got.Status.Phase != "Failed" || got.Status.Reason != ReasonNodeLost || got.Status.Message != "node n lost" {
		t.Errorf("lost pod status = %s %s %q", got.Status.Phase, got.Status.Reason, got.Status.Message)
	}
}

// TestUpdatePodSettingsChanged: a running pod whose annotations now state
// another network, environment, user or template fails with
// BerthSettingsChanged and its sandbox is destroyed; the same settings
// written another way ("none" for no annotation, {} for no environment)
// change nothing.
func TestUpdatePodSettingsChanged(t *testing.T) {
	for _, tc := range []struct {
		name    string
		set     map[string]string
		changed bool
	}{
		{"none spelled out", map[string]string{AnnotationNetwork: "none", AnnotationEnv: "{}"}, false},
		{"none as JSON", map[string]string{AnnotationNetwork: `{"mode":"none"}`}, false},
		{"network opened", map[string]string{AnnotationNetwork: "open"}, true},
		{"environment", map[string]string{AnnotationEnv: `{"A":"1"}`}, true},
		{"user", map[string]string{AnnotationUser: "agent"}, true},
		{"template", map[string]string{AnnotationTemplate: "other"}, true},
		{"not a policy", map[string]string{AnnotationNetwork: "sometimes"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := &lifeRecorder{timeouts: make(chan time.Duration, 4), kills: make(chan string, 4)}
			ctx, cancel := context.WithCancel(t.Context())
			p := &Pods{ctx: ctx, sb: rec, log: slog.New(slog.DiscardHandler), pods: map[string]*podState{}}
			t.Cleanup(func() {
				cancel()
				p.Wait()
			})
			pod := testPod()
			pl, err := planPod(pod, "node")
			if err != nil {
				t.Fatal(err)
			}
			_, pcancel := context.WithCancel(ctx)
			p.pods[key(pod.Namespace, pod.Name)] = &podState{pod: pod.DeepCopy(), plan: pl, sandboxID: "sb", cancel: pcancel,
				containers: map[string]*containerState{}}
			upd := pod.DeepCopy()
			if upd.Annotations == nil {
				upd.Annotations = map[string]string{}
			}
			for k, v := range tc.set {
				upd.Annotations[k] = v
			}
			if err := p.UpdatePod(ctx, upd); err != nil {
				t.Fatal(err)
			}
			p.Wait()
			got, err := p.GetPod(ctx, pod.Namespace, pod.Name)
			if err != nil {
				t.Fatal(err)
			}
			failed := got.Status.Reason == ReasonSettingsChanged
			if failed != tc.changed {
				t.Fatalf("pod status %s %s %q; want failed=%v", got.Status.Phase, got.Status.Reason, got.Status.Message, tc.changed)
			}
			select {
			case id := <-rec.kills:
				if !tc.changed || id != "sb" {
					t.Errorf("killed %q (changed=%v)", id, tc.changed)
				}
			default:
				if tc.changed {
					t.Error("sandbox not destroyed")
				}
			}
		})
	}
}
