package node

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// TestContainerEnv: envFrom (prefixed, keys that are no variable name
// skipped), then literal env, then valueFrom (ConfigMap and Secret keys,
// pod fields) make the environment; a missing optional reference is
// skipped and a missing required one fails naming it; what the node
// cannot resolve is refused at plan.
func TestContainerEnv(t *testing.T) {
	pod := testPod()
	pod.Labels = map[string]string{"app": "agent"}
	opt := true
	c := &pod.Spec.Containers[0]
	c.EnvFrom = []corev1.EnvFromSource{
		{Prefix: "CFG_", ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "settings"}}},
		{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "gone"}, Optional: &opt}},
	}
	c.Env = append(c.Env,
		corev1.EnvVar{Name: "TOKEN", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "creds"}, Key: "token"}}},
		corev1.EnvVar{Name: "MODE", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "settings"}, Key: "mode"}}},
		corev1.EnvVar{Name: "MAYBE", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "settings"}, Key: "nope", Optional: &opt}}},
		corev1.EnvVar{Name: "POD", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
		corev1.EnvVar{Name: "APP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.labels['app']"}}},
		corev1.EnvVar{Name: "HOST", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.hostIP"}}},
		corev1.EnvVar{Name: "WHO", Value: "$(POD) in $(MODE), not $(LATER) or $$(POD)"},
		corev1.EnvVar{Name: "LATER", Value: "later"},
	)
	c.Args = []string{"echo $(WHO) $(NOPE)"}
	pl, err := planPod(pod, "berth-a")
	if err != nil {
		t.Fatal(err)
	}
	kube := fake.NewClientset(
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "settings"}, Data: map[string]string{"mode": "fast", "A": "from-cm", "bad key": "x"}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "creds"}, Data: map[string][]byte{"token": []byte("s3cret")}},
	)
	p := &Pods{kube: kube, node: "berth-a", ip: "192.0.2.7"}
	ps := &podState{pod: pod, plan: pl}
	env, argv, err := p.containerEnv(t.Context(), ps, pl.containers[0])
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"CFG_mode": "fast", "CFG_A": "from-cm", "A": "1", "TOKEN": "s3cret", "MODE": "fast", "POD": "job-1", "APP": "agent", "HOST": "192.0.2.7",
		"WHO": "job-1 in fast, not $(LATER) or $(POD)", "LATER": "later"}
	if !reflect.DeepEqual(env, want) {
		t.Errorf("env = %v, want %v", env, want)
	}
	if wantArgv := []string{"sh", "-c", "echo job-1 in fast, not $(LATER) or $(POD) $(NOPE)"}; !reflect.DeepEqual(argv, wantArgv) {
		t.Errorf("argv = %q, want %q", argv, wantArgv)
	}
	// A required key that is not there fails the start, naming it.
	if err := kube.CoreV1().Secrets("team").Delete(t.Context(), "creds", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := p.containerEnv(t.Context(), ps, pl.containers[0]); err == nil || !strings.Contains(err.Error(), `secret "creds"`) {
		t.Errorf("without the secret: %v, want an error naming it", err)
	}
	for _, tc := range []struct {
		src   corev1.EnvVarSource
		field string
	}{
		{corev1.EnvVarSource{ResourceFieldRef: &corev1.ResourceFieldSelector{Resource: "limits.cpu"}}, "spec.containers[0].env[0].valueFrom.resourceFieldRef"},
		{corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.phase"}}, "spec.containers[0].env[0].valueFrom.fieldRef.fieldPath"},
	} {
		bad := testPod()
		bad.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "X", ValueFrom: &tc.src}}
		var pe *planError
		if _, err := planPod(bad, "n"); !errors.As(err, &pe) || pe.field != tc.field {
			t.Errorf("planPod(%+v) = %v, want a plan error on %s", tc.src, err, tc.field)
		}
	}
}

func TestExpand(t *testing.T) {
	env := map[string]string{"A": "x", "EMPTY": ""}
	for in, want := range map[string]string{
		"plain": "plain", "$(A)": "x", "a$(A)b$(A)": "axbx", "$(EMPTY)!": "!", "$(B)": "$(B)",
		"$$(A)": "$(A)", "$$": "$", "$": "$", "$A": "$A", "$(A": "$(A", "cost $5": "cost $5", "$($(A))": "$($(A))",
	} {
		if got := expand(in, env); got != want {
			t.Errorf("expand(%q) = %q, want %q", in, got, want)
		}
	}
}
