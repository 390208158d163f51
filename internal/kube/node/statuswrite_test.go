package node

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// TestStatusOnlyUpdate: a status built from an older copy of the pod
// (without the annotation the gateway wrote since) replaces the status
// and leaves the annotation; a pod made again under the same name (another
// UID) is not written.
func TestStatusOnlyUpdate(t *testing.T) {
	ctx := t.Context()
	stale := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "sb", Namespace: "ns", UID: "uid-1", Annotations: map[string]string{AnnotationDeadline: "old"}},
		Status:     corev1.PodStatus{Phase: corev1.PodPending},
	}
	cur := stale.DeepCopy()
	cur.Annotations = map[string]string{AnnotationDeadline: "new", AnnotationPaused: "2026-12-05T19:12:53Z"}
	kube := fake.NewClientset(cur)
	pods := statusOnlyPods{kube.CoreV1()}.Pods("ns")

	stale.Status = corev1.PodStatus{Phase: corev1.PodRunning, Message: "running", Conditions: []corev1.PodCondition{{Type: ConditionPaused, Status: corev1.ConditionFalse, Reason: PausePausing}}}
	if _, err := pods.UpdateStatus(ctx, stale, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	got, err := kube.CoreV1().Pods("ns").Get(ctx, "sb", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Annotations[AnnotationPaused] == "" || got.Annotations[AnnotationDeadline] != "new" {
		t.Errorf("annotations after a status write = %v, want the gateway's (paused, deadline new)", got.Annotations)
	}
	if got.Status.Phase != corev1.PodRunning || got.Status.Message != "running" || len(got.Status.Conditions) != 1 {
		t.Errorf("status = %+v, want the one written", got.Status)
	}

	// The status replaces the old one whole: a field the new one leaves
	// empty is emptied.
	stale.Status = corev1.PodStatus{Phase: corev1.PodRunning}
	if _, err := pods.UpdateStatus(ctx, stale, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	got, _ = kube.CoreV1().Pods("ns").Get(ctx, "sb", metav1.GetOptions{})
	if got.Status.Message != "" || len(got.Status.Conditions) != 0 {
		t.Errorf("status after an emptier write = %+v, want only the phase", got.Status)
	}

	other := stale.DeepCopy()
	other.UID = "uid-2"
	other.Status.Phase = corev1.PodFailed
	if _, err := pods.UpdateStatus(ctx, other, metav1.UpdateOptions{}); err == nil {
		t.Error("a status for another pod of the same name was written")
	}
	got, _ = kube.CoreV1().Pods("ns").Get(ctx, "sb", metav1.GetOptions{})
	if got.Status.Phase != corev1.PodRunning {
		t.Errorf("phase = %s after another UID's write, want Running", got.Status.Phase)
	}
}
