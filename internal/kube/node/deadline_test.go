package node

import (
	"context"
	"errors"
	"log/slog"
	"reflect"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/errdefs"
)

// lifeRecorder is a daemon that records deadline settings, kills and
// network policies.
type lifeRecorder struct {
	Sandboxes
	timeouts chan time.Duration
	kills    chan string
	policies chan client.NetworkPolicy
}

// SetNetworkPolicy records np, and refuses as a daemon's ceiling would
// a policy that allows refused.example.
func (r *lifeRecorder) SetNetworkPolicy(_ context.Context, _ string, np client.NetworkPolicy) error {
	if slices.Contains(np.Allow, "refused.example") {
		return &errdefs.Error{Code: errdefs.CodePermissionDenied, Message: "allow[0] \"refused.example\": beyond the operator's ceiling"}
	}
	r.policies <- np
	return nil
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

// runningPod is a Pods on rec's fake daemon holding pod, running as
// sandbox "sb" with its annotations applied.
func runningPod(t *testing.T, pod *corev1.Pod) (*Pods, *lifeRecorder, *podState) {
	t.Helper()
	rec := &lifeRecorder{timeouts: make(chan time.Duration, 8), kills: make(chan string, 8), policies: make(chan client.NetworkPolicy, 8)}
	ctx, cancel := context.WithCancel(t.Context())
	p := &Pods{ctx: ctx, sb: rec, log: slog.New(slog.DiscardHandler), pods: map[string]*podState{}}
	t.Cleanup(func() {
		cancel()
		p.Wait()
	})
	pl, err := planPod(pod, "node")
	if err != nil {
		t.Fatal(err)
	}
	_, pcancel := context.WithCancel(ctx)
	ps := &podState{pod: pod.DeepCopy(), plan: pl, sandboxID: "sb", cancel: pcancel, containers: map[string]*containerState{},
		applied: pod.Annotations[AnnotationDeadline], net: netState{applied: pod.Annotations[AnnotationNetwork], known: true}}
	p.pods[key(pod.Namespace, pod.Name)] = ps
	return p, rec, ps
}

// TestUpdatePodDeadlineAndLost: a moved deadline annotation becomes the
// sandbox's deadline (once per value); the lost annotation fails the pod
// with NodeLost and destroys its sandbox.
func TestUpdatePodDeadlineAndLost(t *testing.T) {
	pod := testPod()
	pod.Annotations = map[string]string{AnnotationDeadline: time.Now().Add(time.Minute).UTC().Format(time.RFC3339)}
	p, rec, ps := runningPod(t, pod)
	ctx := t.Context()
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
		{"network opened (applied, not a change)", map[string]string{AnnotationNetwork: "open"}, false},
		{"environment", map[string]string{AnnotationEnv: `{"A":"1"}`}, true},
		{"user", map[string]string{AnnotationUser: "agent"}, true},
		{"template", map[string]string{AnnotationTemplate: "other"}, true},
		{"snapshot", map[string]string{AnnotationSnapshot: "snap1"}, true},
		{"not a policy (refused, not a change)", map[string]string{AnnotationNetwork: "sometimes"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := testPod()
			p, rec, _ := runningPod(t, pod)
			ctx := t.Context()
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

// TestUpdatePodNetwork: a changed network annotation becomes the running
// sandbox's egress policy, and ConditionNetwork says so for that value; a
// value the node cannot parse or the daemon refuses changes nothing in
// the sandbox and is reported refused with its error class; the value
// applied before, written back, is applied again at no cost; the same
// refused value written again gets a new try.
func TestUpdatePodNetwork(t *testing.T) {
	pod := testPod()
	p, rec, _ := runningPod(t, pod)
	ctx := t.Context()

	set := func(v string) *corev1.Pod {
		t.Helper()
		upd := pod.DeepCopy()
		upd.Annotations = map[string]string{AnnotationNetwork: v}
		if err := p.UpdatePod(ctx, upd); err != nil {
			t.Fatal(err)
		}
		p.Wait()
		got, err := p.GetPod(ctx, pod.Namespace, pod.Name)
		if err != nil {
			t.Fatal(err)
		}
		if got.Status.Reason != "" || len(rec.kills) > 0 {
			t.Fatalf("pod failed (%s %q) or its sandbox was destroyed", got.Status.Reason, got.Status.Message)
		}
		return got
	}
	applied := func(want client.NetworkPolicy) {
		t.Helper()
		select {
		case got := <-rec.policies:
			if !reflect.DeepEqual(got, want) {
				t.Errorf("daemon set %+v, want %+v", got, want)
			}
		default:
			t.Errorf("daemon set no policy, want %+v", want)
		}
	}
	none := func() {
		t.Helper()
		if len(rec.policies) > 0 {
			t.Errorf("daemon set %+v, want nothing", <-rec.policies)
		}
	}
	status := func(pod *corev1.Pod, v string, class error) {
		t.Helper()
		done, err := NetworkStatus(pod, v)
		if !done || (class == nil) != (err == nil) || class != nil && !errors.Is(err, class) {
			t.Errorf("NetworkStatus(%q) = %v, %v; want done with %v (conditions %+v)", v, done, err, class, pod.Status.Conditions)
		}
	}

	allow := `{"mode":"allow","allow":["pypi.org"]}`
	got := set(allow)
	applied(client.NetworkPolicy{Mode: "allow", Allow: []string{"pypi.org"}})
	status(got, allow, nil)
	if done, _ := NetworkStatus(got, "open"); done {
		t.Error("the condition answers for a value never written")
	}

	got = set("sometimes")
	none()
	status(got, "sometimes", errdefs.ErrInvalidArgument)

	refused := `{"mode":"allow","allow":["refused.example"]}`
	got = set(refused)
	none()
	status(got, refused, errdefs.ErrPermissionDenied)

	// Written back, the policy the sandbox holds is reported applied
	// without another call.
	got = set(allow)
	none()
	status(got, allow, nil)

	// "none" means the daemon's none.
	got = set("none")
	applied(client.NetworkPolicy{Mode: "none"})
	status(got, "none", nil)
}
