package node

import (
	"context"
	"errors"
	"log/slog"
	"reflect"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	corev1listers "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
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
		corev1.EnvVar{Name: "MEM_MI", ValueFrom: &corev1.EnvVarSource{ResourceFieldRef: &corev1.ResourceFieldSelector{Resource: "limits.memory", Divisor: resource.MustParse("1Mi")}}},
		corev1.EnvVar{Name: "CPU", ValueFrom: &corev1.EnvVarSource{ResourceFieldRef: &corev1.ResourceFieldSelector{Resource: "limits.cpu"}}},
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
		"WHO": "job-1 in fast, not $(LATER) or $(POD)", "LATER": "later", "MEM_MI": "256", "CPU": "1"}
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
		{corev1.EnvVarSource{ResourceFieldRef: &corev1.ResourceFieldSelector{Resource: "limits.gpu"}}, "spec.containers[0].env[0].valueFrom.resourceFieldRef.resource"},
		{corev1.EnvVarSource{ResourceFieldRef: &corev1.ResourceFieldSelector{Resource: "limits.cpu", ContainerName: "nope"}}, "spec.containers[0].env[0].valueFrom.resourceFieldRef.containerName"},
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

// TestStartWaitsForConfig: a container whose ConfigMap is not there yet
// does not start and does not fail the pod: it waits with
// CreateContainerConfigError naming the ConfigMap, and starts once the
// ConfigMap appears (read again after the retry wait).
func TestStartWaitsForConfig(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeRunner()
		kube := fake.NewClientset()
		pod := testPod()
		pod.Spec.Containers[0].EnvFrom = []corev1.EnvFromSource{{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "settings"}}}}
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		p := &Pods{ctx: ctx, sb: f, kube: kube, backOff: newBackOff(time.Second, 4*time.Second), log: slog.New(slog.DiscardHandler), pods: map[string]*podState{}}
		pl, err := planPod(pod, "node")
		if err != nil {
			t.Fatal(err)
		}
		ps := &podState{pod: pod, plan: pl, sandboxID: "sb", containers: map[string]*containerState{}}
		started := make(chan error, 1)
		go func() {
			_, err := p.startContainer(ctx, ps, pl.containers[0], 0)
			started <- err
		}()
		status := func() (corev1.PodPhase, corev1.ContainerStatus) {
			p.mu.Lock()
			defer p.mu.Unlock()
			pod := p.withStatus(ps)
			return pod.Status.Phase, pod.Status.ContainerStatuses[0]
		}
		synctest.Wait()
		phase, cs := status()
		if w := cs.State.Waiting; phase != corev1.PodPending || w == nil || w.Reason != reasonConfigError || !strings.Contains(w.Message, `configmap "settings" not found`) {
			t.Errorf("without the ConfigMap: %s, %+v; want Pending, waiting with %s naming it", phase, cs.State, reasonConfigError)
		}
		if got := f.starts(); len(got) != 0 {
			t.Errorf("started %v without its ConfigMap", got)
		}
		if _, err := kube.CoreV1().ConfigMaps(pod.Namespace).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "settings"}, Data: map[string]string{"MODE": "x"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		// Inside the synctest bubble: the fake clock moves past the
		// longest retry wait (no real time passes), and Wait lets the
		// start act on it.
		time.Sleep(configRetryMax)
		synctest.Wait()
		if err := <-started; err != nil {
			t.Fatalf("start = %v", err)
		}
		phase, cs = status()
		if phase != corev1.PodRunning || cs.State.Running == nil {
			t.Errorf("with the ConfigMap: %s, %+v; want running", phase, cs.State)
		}
	})
}

// TestServiceEnv: every container gets the "kubernetes" Service's
// variables, and, unless the pod turns service links off, those of each
// Service of its namespace with a cluster IP, named as a kubelet names
// them.
func TestServiceEnv(t *testing.T) {
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	for _, s := range []*corev1.Service{
		{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "kubernetes"}, Spec: corev1.ServiceSpec{ClusterIP: "10.0.0.1", Ports: []corev1.ServicePort{{Name: "https", Port: 443}}}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "pg-main"}, Spec: corev1.ServiceSpec{ClusterIP: "10.0.0.5", Ports: []corev1.ServicePort{{Name: "pg", Port: 5432}, {Name: "metrics", Port: 9187, Protocol: corev1.ProtocolUDP}}}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "headless"}, Spec: corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone, Ports: []corev1.ServicePort{{Port: 80}}}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "other", Name: "elsewhere"}, Spec: corev1.ServiceSpec{ClusterIP: "10.0.0.9", Ports: []corev1.ServicePort{{Port: 80}}}},
	} {
		if err := idx.Add(s); err != nil {
			t.Fatal(err)
		}
	}
	p := &Pods{services: corev1listers.NewServiceLister(idx)}
	pod := testPod()
	env := p.serviceEnv(pod)
	want := map[string]string{
		"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443", "KUBERNETES_SERVICE_PORT_HTTPS": "443",
		"KUBERNETES_PORT": "tcp://10.0.0.1:443", "KUBERNETES_PORT_443_TCP": "tcp://10.0.0.1:443", "KUBERNETES_PORT_443_TCP_PROTO": "tcp",
		"KUBERNETES_PORT_443_TCP_PORT": "443", "KUBERNETES_PORT_443_TCP_ADDR": "10.0.0.1",
		"PG_MAIN_SERVICE_HOST": "10.0.0.5", "PG_MAIN_SERVICE_PORT": "5432", "PG_MAIN_SERVICE_PORT_PG": "5432", "PG_MAIN_SERVICE_PORT_METRICS": "9187",
		"PG_MAIN_PORT": "tcp://10.0.0.5:5432", "PG_MAIN_PORT_5432_TCP": "tcp://10.0.0.5:5432", "PG_MAIN_PORT_5432_TCP_PROTO": "tcp",
		"PG_MAIN_PORT_5432_TCP_PORT": "5432", "PG_MAIN_PORT_5432_TCP_ADDR": "10.0.0.5",
		"PG_MAIN_PORT_9187_UDP": "udp://10.0.0.5:9187", "PG_MAIN_PORT_9187_UDP_PROTO": "udp", "PG_MAIN_PORT_9187_UDP_PORT": "9187", "PG_MAIN_PORT_9187_UDP_ADDR": "10.0.0.5",
	}
	if !reflect.DeepEqual(env, want) {
		t.Errorf("service env = %v\nwant %v", env, want)
	}
	off := false
	pod.Spec.EnableServiceLinks = &off
	env = p.serviceEnv(pod)
	if len(env) != 8 || env["KUBERNETES_SERVICE_HOST"] != "10.0.0.1" || env["PG_MAIN_SERVICE_HOST"] != "" {
		t.Errorf("without service links = %v, want the kubernetes Service's only", env)
	}
}
