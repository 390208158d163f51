package node

import (
	"context"
	"log/slog"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ktypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
)

// TestFreeSnapshot: before a snapshot is removed, the node destroys the
// sandboxes made from it whose pods are gone from the API, being deleted,
// or replaced by another pod of the name; a live pod's sandbox, and one
// made from another snapshot, stay.
func TestFreeSnapshot(t *testing.T) {
	mk := func(name, uid, snap string) *corev1.Pod {
		pod := testPod()
		pod.Name, pod.UID = name, ktypes.UID(uid)
		pod.Annotations = map[string]string{AnnotationSnapshot: snap}
		return pod
	}
	live, gone, deleting, replaced, other := mk("live", "u1", "s1"), mk("gone", "u2", "s1"), mk("deleting", "u3", "s1"), mk("replaced", "u4", "s1"), mk("other", "u5", "s2")
	now := metav1.Now()
	inAPI := deleting.DeepCopy()
	inAPI.DeletionTimestamp = &now
	newer := replaced.DeepCopy()
	newer.UID = "u9"
	kube := fake.NewClientset(live, inAPI, newer, other)
	rec := &lifeRecorder{kills: make(chan string, 8)}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	p := &Pods{ctx: ctx, sb: rec, kube: kube, log: slog.New(slog.DiscardHandler), pods: map[string]*podState{}}
	for i, pod := range []*corev1.Pod{live, gone, deleting, replaced, other} {
		pl, err := planPod(pod, "node")
		if err != nil {
			t.Fatal(err)
		}
		p.pods[key(pod.Namespace, pod.Name)] = &podState{pod: pod, plan: pl, sandboxID: "sb" + string(rune('a'+i))}
	}
	p.freeSnapshot(ctx, "s1")
	close(rec.kills)
	var killed []string
	for id := range rec.kills {
		killed = append(killed, id)
	}
	want := map[string]bool{"sbb": true, "sbc": true, "sbd": true}
	if len(killed) != len(want) {
		t.Fatalf("destroyed %v, want sbb, sbc, sbd", killed)
	}
	for _, id := range killed {
		if !want[id] {
			t.Errorf("destroyed %s (of a live pod, or of another snapshot)", id)
		}
	}
}
