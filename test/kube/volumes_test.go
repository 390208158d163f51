package kube

import (
	"context"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"

	"github.com/berth-sandbox/berth/test/harness"
)

// TestPodVolumes: an emptyDir volume two containers mount at different
// paths is one directory of the sandbox (each container's file shows at
// the other's path), a subPath mount is a part of its volume, and a pod
// with a volume type Berth cannot honour fails naming it. The containers'
// environment comes from a ConfigMap (envFrom), a Secret's key and the
// pod's fields, read when they start. A projected volume holds a token of
// the pod's service account (the API server takes it as that account),
// the cluster's CA and the namespace; a downwardAPI volume the pod's
// labels (following a change) and a container's memory limit.
func TestPodVolumes(t *testing.T) {
	c := startClusterWith(t, []string{"--config-sync-period", "1s"}, "berth-a")
	cp := c.cp
	ctx := t.Context()
	pods := cp.Client.CoreV1().Pods("default")
	if _, err := cp.Client.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "agent-settings"},
		Data: map[string]string{"MODE": "review"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cp.Client.CoreV1().Secrets("default").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "agent-creds"},
		Data: map[string][]byte{"token": []byte("s3cret-token")}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cp.Client.CoreV1().ServiceAccounts("default").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "agent"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	caPEM, err := os.ReadFile(cp.CA)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cp.Client.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "kube-root-ca.crt"},
		Data: map[string]string{"ca.crt": string(caPEM)}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := sandboxPod("shared", "sh", "-c", "echo from-main > /work/main.txt && echo cached > /cache/pip/wheel && exec sleep 3601")
	pod.Labels = map[string]string{"stage": "one"}
	pod.Spec.ServiceAccountName = "agent"
	empty := corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}
	m400 := int32(0o400)
	pod.Spec.Volumes = []corev1.Volume{{Name: "work", VolumeSource: empty}, {Name: "cache", VolumeSource: empty},
		{Name: "settings", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "agent-settings"}}}},
		{Name: "creds", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "agent-creds",
			Items: []corev1.KeyToPath{{Key: "token", Path: "api/token", Mode: &m400}}}}},
		{Name: "kube-api-access", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
			{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token"}},
			{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "kube-root-ca.crt"}, Items: []corev1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}}}},
			{DownwardAPI: &corev1.DownwardAPIProjection{Items: []corev1.DownwardAPIVolumeFile{{Path: "namespace", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.namespace"}}}}},
		}}}},
		{Name: "podinfo", VolumeSource: corev1.VolumeSource{DownwardAPI: &corev1.DownwardAPIVolumeSource{Items: []corev1.DownwardAPIVolumeFile{
			{Path: "labels", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.labels"}},
			{Path: "mem", ResourceFieldRef: &corev1.ResourceFieldSelector{ContainerName: "main", Resource: "limits.memory", Divisor: resource.MustParse("1Mi")}},
		}}}}}
	pod.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "work", MountPath: "/work"}, {Name: "cache", MountPath: "/cache/pip", SubPath: "pip"},
		{Name: "settings", MountPath: "/etc/agent", ReadOnly: true}, {Name: "creds", MountPath: "/run/creds", ReadOnly: true},
		{Name: "kube-api-access", MountPath: "/var/run/secrets/kubernetes.io/serviceaccount", ReadOnly: true}, {Name: "podinfo", MountPath: "/etc/podinfo"}}
	pod.Spec.Containers[0].EnvFrom = []corev1.EnvFromSource{{Prefix: "CFG_", ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "agent-settings"}}}}
	pod.Spec.Containers[0].Env = append(pod.Spec.Containers[0].Env,
		corev1.EnvVar{Name: "TOKEN", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "agent-creds"}, Key: "token"}}},
		corev1.EnvVar{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
		corev1.EnvVar{Name: "WHERE", Value: "$(POD_NAME)/$(CFG_MODE)"})
	side := pod.Spec.Containers[0]
	side.Env, side.EnvFrom = nil, nil
	side.Name, side.Command = "side", []string{"sh", "-c", "echo from-side > /srv/shared/side.txt && exec sleep 3600"}
	side.VolumeMounts = []corev1.VolumeMount{{Name: "work", MountPath: "/srv/shared"}, {Name: "cache", MountPath: "/cache-all"}}
	pod.Spec.Containers = append(pod.Spec.Containers, side)
	if _, err := pods.Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPod(t, cp, "default", "shared", "Running", phase(corev1.PodRunning))
	var out, stderr string
	harness.WaitFor(t, time.Minute, "both containers' files", func() bool {
		var code int
		out, stderr, code = execPod(t, cp, "default", "shared", "", "sh", "-c", "cat /work/side.txt /srv/shared/main.txt /cache-all/pip/wheel && readlink /srv/shared")
		return code == 0
	})
	if out != "from-side\nfrom-main\ncached\n/work\n" {
		t.Errorf("through the volumes: %q (stderr %q)", out, stderr)
	}
	// The ConfigMap's keys and the Secret's item are files.
	out, stderr, code := execPod(t, cp, "default", "shared", "", "sh", "-c", "cat /etc/agent/MODE; echo; cat /run/creds/api/token; echo; stat -c %a /run/creds/api/token")
	if want := "review\ns3cret-token\n400\n"; code != 0 || out != want {
		t.Errorf("configMap and secret volumes = %q (%d, %q), want %q", out, code, stderr, want)
	}
	// The main container's process has the resolved environment.
	out, stderr, code = execPod(t, cp, "default", "shared", "", "sh", "-c", `for p in /proc/[0-9]*; do [ "$(tr '\0' ' ' < $p/cmdline 2>/dev/null)" = "sleep 3601 " ] && tr '\0' '\n' < $p/environ; done | grep -E '^(CFG_MODE|TOKEN|POD_NAME|GREETING|WHERE)=' | sort`)
	if want := "CFG_MODE=review\nGREETING=hello from kubernetes\nPOD_NAME=shared\nTOKEN=s3cret-token\nWHERE=shared/review\n"; code != 0 || out != want {
		t.Errorf("main container's environment = %q (%d, %q), want %q", out, code, stderr, want)
	}
	// The cluster's "kubernetes" Service's variables, as a kubelet sets.
	out, stderr, code = execPod(t, cp, "default", "shared", "", "sh", "-c", `for p in /proc/[0-9]*; do [ "$(tr '\0' ' ' < $p/cmdline 2>/dev/null)" = "sleep 3601 " ] && tr '\0' '\n' < $p/environ; done | grep -cE '^KUBERNETES_SERVICE_HOST=[0-9a-f.:]+$'`)
	if code != 0 || out != "1\n" {
		t.Errorf("KUBERNETES_SERVICE_HOST in the container's environment: %q (%d, %q), want one", out, code, stderr)
	}
	// The ConfigMap and the Secret change: their volumes follow (the
	// environment, read at the start, does not).
	if _, err := cp.Client.CoreV1().ConfigMaps("default").Update(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "agent-settings"},
		Data: map[string]string{"MODE": "approve", "LEVEL": "2"}}, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cp.Client.CoreV1().Secrets("default").Update(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "agent-creds"},
		Data: map[string][]byte{"token": []byte("rotated-token")}}, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	harness.WaitFor(t, time.Minute, "the volumes to follow their objects", func() bool {
		out, _, code := execPod(t, cp, "default", "shared", "", "sh", "-c", "cat /etc/agent/MODE /etc/agent/LEVEL /run/creds/api/token; stat -c %a /run/creds/api/token")
		return code == 0 && out == "approve2rotated-token400\n"
	})
	// The service account token volume: the API server takes the token
	// as the pod's service account; the CA and namespace are there.
	out, stderr, code = execPod(t, cp, "default", "shared", "", "sh", "-c", "cd /var/run/secrets/kubernetes.io/serviceaccount && cat namespace && echo && cat token")
	ns, token, _ := strings.Cut(out, "\n")
	if code != 0 || ns != "default" || token == "" {
		t.Fatalf("service account volume: %q (%d, %q)", out, code, stderr)
	}
	if got, _, _ := execPod(t, cp, "default", "shared", "", "cat", "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"); got != string(caPEM) {
		t.Errorf("ca.crt in the pod = %q, want the cluster's CA", got)
	}
	as := rest.AnonymousClientConfig(cp.Config)
	as.BearerToken = token
	asClient, err := kubernetes.NewForConfig(as)
	if err != nil {
		t.Fatal(err)
	}
	review, err := asClient.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil || review.Status.UserInfo.Username != "system:serviceaccount:default:agent" {
		t.Errorf("the pod's token authenticates as %+v (%v), want system:serviceaccount:default:agent", review, err)
	}
	// The downwardAPI volume: the container's limit, and labels that
	// follow the pod's.
	out, stderr, code = execPod(t, cp, "default", "shared", "", "sh", "-c", "cat /etc/podinfo/mem; echo; cat /etc/podinfo/labels")
	if want := "128\nstage=\"one\""; code != 0 || out != want {
		t.Errorf("downwardAPI volume = %q (%d, %q), want %q", out, code, stderr, want)
	}
	if _, err := pods.Patch(ctx, "shared", types.MergePatchType, []byte(`{"metadata":{"labels":{"stage":"two","team":"a"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	harness.WaitFor(t, time.Minute, "the labels file to follow the pod's labels", func() bool {
		out, _, code := execPod(t, cp, "default", "shared", "", "cat", "/etc/podinfo/labels")
		return code == 0 && out == "stage=\"two\"\nteam=\"a\""
	})
	if err := pods.Delete(ctx, "shared", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPodGone(t, cp, "default", "shared")

	// A pod made before its Secret and ConfigMap waits for them, as on
	// a kubelet: ContainerCreating naming the Secret its volume needs,
	// then CreateContainerConfigError naming the ConfigMap its env needs,
	// then it runs with both.
	late := sandboxPod("late-config", "sh", "-c", "echo $LATE_MODE; cat /run/late/key; echo; exec sleep 3600")
	late.Spec.RestartPolicy = corev1.RestartPolicyOnFailure
	late.Spec.Volumes = []corev1.Volume{{Name: "late", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "late-secret"}}}}
	late.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "late", MountPath: "/run/late", ReadOnly: true}}
	late.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "LATE_MODE", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{
		LocalObjectReference: corev1.LocalObjectReference{Name: "late-settings"}, Key: "mode"}}}}
	if _, err := pods.Create(ctx, late, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waiting := func(reason, names string) func(*corev1.Pod) bool {
		return func(p *corev1.Pod) bool {
			cs := p.Status.ContainerStatuses
			return len(cs) == 1 && cs[0].State.Waiting != nil && cs[0].State.Waiting.Reason == reason && strings.Contains(cs[0].State.Waiting.Message, names)
		}
	}
	got := waitPod(t, cp, "default", "late-config", "waiting for the Secret", waiting("ContainerCreating", "late-secret"))
	if got.Status.Phase != corev1.PodPending {
		t.Errorf("phase while the Secret is missing: %s, want Pending", got.Status.Phase)
	}
	if _, err := cp.Client.CoreV1().Secrets("default").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "late-secret"},
		Data: map[string][]byte{"key": []byte("late-key")}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPod(t, cp, "default", "late-config", "waiting for the ConfigMap", waiting("CreateContainerConfigError", "late-settings"))
	if _, err := cp.Client.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "late-settings"},
		Data: map[string]string{"mode": "late-mode"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPod(t, cp, "default", "late-config", "Running", phase(corev1.PodRunning))
	harness.WaitFor(t, time.Minute, "the late pod's output", func() bool {
		return strings.Count(podLogs(t, cp, "default", "late-config"), "\n") >= 2
	})
	if got := podLogs(t, cp, "default", "late-config"); got != "late-mode\nlate-key\n" {
		t.Errorf("late pod printed %q, want the ConfigMap's mode and the Secret's key", got)
	}
	if err := pods.Delete(ctx, "late-config", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPodGone(t, cp, "default", "late-config")

	bad := sandboxPod("hostpath", "true")
	bad.Spec.Volumes = []corev1.Volume{{Name: "host", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/etc"}}}}
	bad.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "host", MountPath: "/host"}}
	if _, err := pods.Create(ctx, bad, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	got = waitPod(t, cp, "default", "hostpath", "Failed", phase(corev1.PodFailed))
	if got.Status.Reason != "BerthInvalidPod" || !strings.Contains(got.Status.Message, "spec.volumes[0]") {
		t.Errorf("hostPath pod status = %s: %s", got.Status.Reason, got.Status.Message)
	}
	if err := pods.Delete(ctx, "hostpath", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPodGone(t, cp, "default", "hostpath")
}

// TestPodAttach: kubectl attach (through the API server, to the node)
// streams what the container prints from then on, stdout and stderr
// apart, and ends when the container exits; with -i (and -t) it types
// into a container made with stdin (and a terminal).
func TestPodAttach(t *testing.T) {
	c := startCluster(t, "berth-a")
	cp := c.cp
	ctx := t.Context()
	pod := sandboxPod("talker", "sh", "-c", "i=0; while [ ! -e /tmp/stop ]; do echo tick $i; i=$((i+1)); sleep 0.2; done; echo bye >&2")
	if _, err := cp.Client.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPod(t, cp, "default", "talker", "Running", phase(corev1.PodRunning))
	req := cp.Client.CoreV1().RESTClient().Post().Resource("pods").Namespace("default").Name("talker").SubResource("attach").
		VersionedParams(&corev1.PodAttachOptions{Container: "main", Stdout: true, Stderr: true}, scheme.ParameterCodec)
	ex, err := remotecommand.NewSPDYExecutor(cp.Config, "POST", req.URL())
	if err != nil {
		t.Fatal(err)
	}
	// Stop the container once a tick came through the attach.
	out := &tickWatch{seen: make(chan struct{})}
	var errOut strings.Builder
	stopped := make(chan error, 1)
	go func() {
		select {
		case <-out.seen:
		case <-ctx.Done():
			stopped <- ctx.Err()
			return
		}
		// Not execPod: it may end the test, which only the test's own
		// goroutine may do.
		req := cp.Client.CoreV1().RESTClient().Post().Resource("pods").Namespace("default").Name("talker").SubResource("exec").
			VersionedParams(&corev1.PodExecOptions{Container: "main", Command: []string{"touch", "/tmp/stop"}, Stdout: true, Stderr: true}, scheme.ParameterCodec)
		ex, err := remotecommand.NewSPDYExecutor(cp.Config, "POST", req.URL())
		if err == nil {
			err = ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: io.Discard, Stderr: io.Discard})
		}
		stopped <- err
	}()
	actx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := ex.StreamWithContext(actx, remotecommand.StreamOptions{Stdout: out, Stderr: &errOut}); err != nil {
		t.Fatalf("attach: %v", err)
	}
	if err := <-stopped; err != nil {
		t.Errorf("touch /tmp/stop: %v", err)
	}
	if !strings.HasPrefix(out.String(), "tick ") || errOut.String() != "bye\n" {
		t.Errorf("attached stdout %q, stderr %q; want ticks, then bye on stderr", out.String(), errOut.String())
	}
	if err := cp.Client.CoreV1().Pods("default").Delete(ctx, "talker", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPodGone(t, cp, "default", "talker")

	// kubectl run -it: a container on a terminal of its own, with stdin
	// once; what the attach sends is typed into its shell, and what the
	// shell prints (the terminal's echo included) comes back.
	shell := sandboxPod("shell", "sh")
	shell.Spec.RestartPolicy = corev1.RestartPolicyNever
	shell.Spec.Containers[0].Stdin, shell.Spec.Containers[0].StdinOnce, shell.Spec.Containers[0].TTY = true, true, true
	attachInput(t, cp, shell, "main", true, "echo hi-$((2+3))\nexit 3\n", "hi-5")
	got := waitPod(t, cp, "default", "shell", "Failed", phase(corev1.PodFailed))
	if st := got.Status.ContainerStatuses[0].State.Terminated; st == nil || st.ExitCode != 3 {
		t.Errorf("shell ended %+v, want exit 3", got.Status.ContainerStatuses[0].State)
	}

	// kubectl run -i: stdin once, no terminal: the attach's input, then
	// its end, which ends the container's stdin.
	reader := sandboxPod("reader", "sh", "-c", "cat; echo stdin-ended")
	reader.Spec.RestartPolicy = corev1.RestartPolicyNever
	reader.Spec.Containers[0].Stdin, reader.Spec.Containers[0].StdinOnce = true, true
	attachInput(t, cp, reader, "main", false, "line-one\nline-two\n", "line-one\nline-two\nstdin-ended\n")
	waitPod(t, cp, "default", "reader", "Succeeded", phase(corev1.PodSucceeded))
	if got := podLogs(t, cp, "default", "reader"); got != "line-one\nline-two\nstdin-ended\n" {
		t.Errorf("reader's log = %q", got)
	}

	// An init container that asks before the pod goes on: the attach's
	// answer lets it through, and the container starts.
	gated := sandboxPod("gated", "sh", "-c", "echo started; exec sleep 3600")
	gated.Spec.InitContainers = []corev1.Container{{Name: "ask", Image: "minimal", Stdin: true, StdinOnce: true,
		Command: []string{"sh", "-c", `echo proceed?; read answer; [ "$answer" = yes ] && echo approved`}}}
	attachInput(t, cp, gated, "ask", false, "yes\n", "approved\n")
	waitPod(t, cp, "default", "gated", "Running", phase(corev1.PodRunning))
	harness.WaitFor(t, time.Minute, "the container's output", func() bool {
		return containerLogs(t, cp, "default", "gated", "main") == "started\n"
	})
}

// attachInput makes pod, attaches to its container (or init container)
// once it runs (on its terminal when tty) with input as stdin, and checks
// that want is in what the attach streamed before the container ended.
func attachInput(t *testing.T, cp *controlPlane, pod *corev1.Pod, container string, tty bool, input, want string) {
	t.Helper()
	ctx := t.Context()
	if _, err := cp.Client.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPod(t, cp, "default", pod.Name, container+" running", func(p *corev1.Pod) bool {
		for _, cs := range append(slices.Clone(p.Status.InitContainerStatuses), p.Status.ContainerStatuses...) {
			if cs.Name == container {
				return cs.State.Running != nil
			}
		}
		return false
	})
	req := cp.Client.CoreV1().RESTClient().Post().Resource("pods").Namespace("default").Name(pod.Name).SubResource("attach").
		VersionedParams(&corev1.PodAttachOptions{Container: container, Stdin: true, Stdout: true, Stderr: !tty, TTY: tty}, scheme.ParameterCodec)
	ex, err := remotecommand.NewSPDYExecutor(cp.Config, "POST", req.URL())
	if err != nil {
		t.Fatal(err)
	}
	var out, errOut strings.Builder
	opts := remotecommand.StreamOptions{Stdin: strings.NewReader(input), Stdout: &out, Tty: tty}
	if !tty {
		opts.Stderr = &errOut
	}
	actx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := ex.StreamWithContext(actx, opts); err != nil {
		t.Fatalf("attach -i to %s: %v (streamed %q, %q)", pod.Name, err, out.String(), errOut.String())
	}
	if !strings.Contains(out.String(), want) {
		t.Errorf("attach -i to %s streamed %q (stderr %q), want %q in it", pod.Name, out.String(), errOut.String(), want)
	}
}

// tickWatch collects what it is written and closes seen on the first
// write.
type tickWatch struct {
	mu   sync.Mutex
	b    strings.Builder
	seen chan struct{}
	once sync.Once
}

func (w *tickWatch) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.once.Do(func() { close(w.seen) })
	return w.b.Write(p)
}

func (w *tickWatch) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}
