package node

import (
	"errors"
	"reflect"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/berth-sandbox/berth/client"
)

func testPod() *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "job-1", UID: "0b6a1c1e-55d4-4c39-9a4e-0a4f6ddc1a11"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "main", Image: "registry.example/berth/minimal:1.2",
			Command: []string{"sh", "-c"}, Args: []string{"echo hi; exit 3"},
			Env:        []corev1.EnvVar{{Name: "A", Value: "1"}},
			WorkingDir: "/tmp",
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
				corev1.ResourceCPU: resource.MustParse("500m"), corev1.ResourceMemory: resource.MustParse("256Mi")}},
		}}},
	}
}

func TestPlanPod(t *testing.T) {
	p, err := planPod(testPod(), "berth-a")
	if err != nil {
		t.Fatalf("planPod = %v", err)
	}
	want := client.CreateRequest{
		Template: "minimal", CPU: 0.5, Memory: "268435456", Timeout: "86400s",
		Labels: map[string]string{LabelPodUID: "0b6a1c1e-55d4-4c39-9a4e-0a4f6ddc1a11", LabelPodNamespace: "team", LabelPodName: "job-1", LabelNode: "berth-a"},
	}
	if !reflect.DeepEqual(p.req, want) {
		t.Errorf("request = %+v, want %+v", p.req, want)
	}
	wantC := []containerPlan{{name: "main", argv: []string{"sh", "-c", "echo hi; exit 3"}, env: map[string]string{"A": "1"}, vars: []envRef{{name: "A", value: "1"}}, cwd: "/tmp"}}
	if !reflect.DeepEqual(p.containers, wantC) {
		t.Errorf("containers = %+v, want %+v", p.containers, wantC)
	}
}

// TestPlanPodInits: init containers are planned in order with their own
// env and mounts, and the sandbox is sized for the largest of them or the
// containers' sum, whichever is more (the kubelet's effective request).
func TestPlanPodInits(t *testing.T) {
	pod := testPod()
	pod.Spec.Volumes = []corev1.Volume{{Name: "work", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	pod.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "work", MountPath: "/work"}}
	pod.Spec.InitContainers = []corev1.Container{
		{Name: "fetch", Command: []string{"sh", "-c", "echo data > /seed/f"}, Env: []corev1.EnvVar{{Name: "B", Value: "2"}},
			VolumeMounts: []corev1.VolumeMount{{Name: "work", MountPath: "/seed"}},
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
				corev1.ResourceCPU: resource.MustParse("2"), corev1.ResourceMemory: resource.MustParse("128Mi")}}},
		{Name: "check", Command: []string{"test", "-s", "/work/f"}},
	}
	p, err := planPod(pod, "n")
	if err != nil {
		t.Fatalf("planPod = %v", err)
	}
	if len(p.inits) != 2 || p.inits[0].name != "fetch" || p.inits[1].name != "check" || p.inits[0].env["B"] != "2" {
		t.Errorf("inits = %+v", p.inits)
	}
	if p.req.CPU != 2 || p.req.Memory != "268435456" {
		t.Errorf("cpu %v, memory %s: want 2 (the fetch init container's) and 268435456 (the container's)", p.req.CPU, p.req.Memory)
	}
	want := []volumeMount{{volume: "work", path: "/seed"}, {volume: "work", path: "/work"}}
	if !reflect.DeepEqual(p.volumes, want) {
		t.Errorf("volumes = %+v, want %+v", p.volumes, want)
	}
}

// TestPlanPodSidecars: an init container with restartPolicy Always is a
// sidecar: it may have probes, it is followed before the containers, and
// the sandbox is sized for what runs at once (an init container beside
// the sidecars before it, or the containers beside every sidecar).
func TestPlanPodSidecars(t *testing.T) {
	pod := testPod()
	pod.Spec.Containers[0].Resources = corev1.ResourceRequirements{Limits: corev1.ResourceList{
		corev1.ResourceCPU: resource.MustParse("500m"), corev1.ResourceMemory: resource.MustParse("256Mi")}}
	always := corev1.ContainerRestartPolicyAlways
	limits := func(cpu, mem string) corev1.ResourceRequirements {
		l := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu)}
		if mem != "" {
			l[corev1.ResourceMemory] = resource.MustParse(mem)
		}
		return corev1.ResourceRequirements{Limits: l}
	}
	pod.Spec.InitContainers = []corev1.Container{
		{Name: "a", Command: []string{"true"}, Resources: limits("2", "")},
		{Name: "proxy", Command: []string{"sleep", "inf"}, RestartPolicy: &always, Resources: limits("1", "64Mi"),
			ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"true"}}}}},
		{Name: "b", Command: []string{"true"}, Resources: limits("2", "")},
	}
	p, err := planPod(pod, "n")
	if err != nil {
		t.Fatalf("planPod = %v", err)
	}
	if p.inits[0].sidecar || !p.inits[1].sidecar || p.inits[2].sidecar {
		t.Errorf("sidecars = %v %v %v, want only proxy", p.inits[0].sidecar, p.inits[1].sidecar, p.inits[2].sidecar)
	}
	if p.inits[1].probes.readiness == nil {
		t.Error("the sidecar's readiness probe was dropped")
	}
	var names []string
	for _, c := range p.followed() {
		names = append(names, c.name)
	}
	if !reflect.DeepEqual(names, []string{"proxy", "main"}) {
		t.Errorf("followed = %v, want proxy then main", names)
	}
	if got := p.inits[1].restartPolicy(corev1.RestartPolicyNever); got != corev1.RestartPolicyAlways {
		t.Errorf("sidecar restart policy %s, want Always", got)
	}
	// b beside proxy: 3 CPUs; main beside proxy: 256Mi+64Mi.
	if p.req.CPU != 3 || p.req.Memory != "335544320" {
		t.Errorf("cpu %v, memory %s: want 3 and 335544320", p.req.CPU, p.req.Memory)
	}
}

func TestPlanPodAnnotations(t *testing.T) {
	pod := testPod()
	pod.Annotations = map[string]string{AnnotationTemplate: "base", AnnotationIsolation: "gvisor",
		AnnotationNetwork: `{"mode":"allow","allow":["pypi.org"]}`, AnnotationEnv: `{"LANG":"C.UTF-8"}`,
		AnnotationUser: "user", AnnotationAllowSudo: "true", AnnotationSnapshot: "snap1"}
	d := int64(90)
	pod.Spec.ActiveDeadlineSeconds = &d
	p, err := planPod(pod, "n")
	if err != nil {
		t.Fatalf("planPod = %v", err)
	}
	if p.req.Template != "base" || p.req.Isolation != "gvisor" || p.req.Timeout != "90s" || !reflect.DeepEqual(p.req.Env, map[string]string{"LANG": "C.UTF-8"}) {
		t.Errorf("request = %+v", p.req)
	}
	if p.req.Snapshot != "snap1" {
		t.Errorf("snapshot %q, want snap1", p.req.Snapshot)
	}
	if p.req.User != "user" || p.req.AllowSudo == nil || !*p.req.AllowSudo {
		t.Errorf("user %q, allow_sudo %v: want user, true", p.req.User, p.req.AllowSudo)
	}
	if p.req.Network == nil || p.req.Network.Mode != "allow" || !reflect.DeepEqual(p.req.Network.Allow, []string{"pypi.org"}) {
		t.Errorf("network = %+v", p.req.Network)
	}
}

func TestPlanPodRefused(t *testing.T) {
	for _, tc := range []struct {
		name  string
		edit  func(*corev1.Pod)
		field string
	}{
		{"isolation", func(p *corev1.Pod) { p.Annotations = map[string]string{AnnotationIsolation: "vm"} }, "metadata.annotations[berth.dev/isolation]"},
		{"network", func(p *corev1.Pod) { p.Annotations = map[string]string{AnnotationNetwork: "wide"} }, "metadata.annotations[berth.dev/network]"},
		{"network json", func(p *corev1.Pod) { p.Annotations = map[string]string{AnnotationNetwork: `{"mode":"open","x":1}`} }, "metadata.annotations[berth.dev/network]"},
		{"env", func(p *corev1.Pod) { p.Annotations = map[string]string{AnnotationEnv: `{"A":1}`} }, "metadata.annotations[berth.dev/env]"},
		{"allow-sudo", func(p *corev1.Pod) { p.Annotations = map[string]string{AnnotationAllowSudo: "yes"} }, "metadata.annotations[berth.dev/allow-sudo]"},
		{"init without a command", func(p *corev1.Pod) { p.Spec.InitContainers = []corev1.Container{{Name: "i"}} }, "spec.initContainers[0].command"},
		{"init restartPolicy", func(p *corev1.Pod) {
			never := corev1.ContainerRestartPolicy("Never")
			p.Spec.InitContainers = []corev1.Container{{Name: "i", Command: []string{"true"}, RestartPolicy: &never}}
		}, "spec.initContainers[0].restartPolicy"},
		{"sidecar probe", func(p *corev1.Pod) {
			always := corev1.ContainerRestartPolicyAlways
			p.Spec.InitContainers = []corev1.Container{{Name: "i", Command: []string{"true"}, RestartPolicy: &always,
				ReadinessProbe: &corev1.Probe{}}}
		}, "spec.initContainers[0].readinessProbe"},
		{"init probe", func(p *corev1.Pod) {
			p.Spec.InitContainers = []corev1.Container{{Name: "i", Command: []string{"true"}, ReadinessProbe: &corev1.Probe{}}}
		}, "spec.initContainers[0]"},
		{"init name", func(p *corev1.Pod) {
			p.Spec.InitContainers = []corev1.Container{{Name: "I_1", Command: []string{"true"}}}
		}, "spec.initContainers[0].name"},
		{"init mount", func(p *corev1.Pod) {
			p.Spec.InitContainers = []corev1.Container{{Name: "i", Command: []string{"true"}, VolumeMounts: []corev1.VolumeMount{{Name: "nope", MountPath: "/w"}}}}
		}, "spec.initContainers[0].volumeMounts[0].name"},
		{"stdin without a command", func(p *corev1.Pod) {
			p.Spec.Containers[0].Stdin, p.Spec.Containers[0].Command, p.Spec.Containers[0].Args = true, nil, nil
		}, "spec.containers[0].command"},
		{"init container stdin without a command", func(p *corev1.Pod) {
			p.Spec.InitContainers = []corev1.Container{{Name: "i", Image: "minimal", TTY: true}}
		}, "spec.initContainers[0].command"},
		{"valueFrom", func(p *corev1.Pod) {
			p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "S", ValueFrom: &corev1.EnvVarSource{}}}
		}, "spec.containers[0].env[0].valueFrom"},
		{"long name", func(p *corev1.Pod) { p.Name = string(make([]byte, 70)) }, "metadata.name"},
		{"deadline", func(p *corev1.Pod) { d := int64(0); p.Spec.ActiveDeadlineSeconds = &d }, "spec.activeDeadlineSeconds"},
		{"deadline annotation", func(p *corev1.Pod) { p.Annotations = map[string]string{AnnotationDeadline: "in ten minutes"} }, "metadata.annotations[berth.dev/deadline]"},
		{"on-timeout", func(p *corev1.Pod) { p.Annotations = map[string]string{AnnotationOnTimeout: "hibernate"} }, "metadata.annotations[berth.dev/on-timeout]"},
		{"on-timeout without a deadline", func(p *corev1.Pod) { p.Annotations = map[string]string{AnnotationOnTimeout: "pause"} }, "metadata.annotations[berth.dev/on-timeout]"},
		{"idle-pause", func(p *corev1.Pod) {
			p.Annotations = map[string]string{AnnotationIdlePause: "a while", AnnotationDeadline: "2030-01-01T00:00:00Z"}
		}, "metadata.annotations[berth.dev/idle-pause]"},
		{"snapshot", func(p *corev1.Pod) { p.Annotations = map[string]string{AnnotationSnapshot: "../Snap"} }, "metadata.annotations[berth.dev/snapshot]"},
		{"idle-pause without a deadline", func(p *corev1.Pod) { p.Annotations = map[string]string{AnnotationIdlePause: "5m"} }, "metadata.annotations[berth.dev/idle-pause]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := testPod()
			tc.edit(pod)
			_, err := planPod(pod, "n")
			var pe *planError
			if !errors.As(err, &pe) || pe.field != tc.field {
				t.Errorf("planPod = %v, want a plan error on %s", err, tc.field)
			}
		})
	}
}

// TestSandboxTimeout: the deadline annotation and activeDeadlineSeconds
// bound the sandbox's timeout, the earlier winning; without either it is
// the renewed podLease; a deadline already past gives one second.
func TestSandboxTimeout(t *testing.T) {
	now := time.Date(2026, 12, 2, 16, 0, 0, 0, time.UTC)
	ads := func(s int64) *int64 { return &s }
	for _, tc := range []struct {
		name     string
		deadline string
		ads      *int64
		started  time.Time
		want     time.Duration
	}{
		{"none", "", nil, time.Time{}, podLease},
		{"annotation", "2026-12-02T16:10:00Z", nil, time.Time{}, 10 * time.Minute},
		{"annotation past", "2026-12-02T15:00:00Z", nil, time.Time{}, time.Second},
		{"annotation beyond the lease", "2026-12-05T16:00:00Z", nil, time.Time{}, podLease},
		{"active deadline from start", "", ads(600), now.Add(-4 * time.Minute), 6 * time.Minute},
		{"earlier wins: annotation", "2026-12-02T16:01:00Z", ads(600), time.Time{}, time.Minute},
		{"earlier wins: active deadline", "2026-12-02T17:00:00Z", ads(60), time.Time{}, time.Minute},
	} {
		pod := testPod()
		if tc.deadline != "" {
			pod.Annotations = map[string]string{AnnotationDeadline: tc.deadline}
		}
		pod.Spec.ActiveDeadlineSeconds = tc.ads
		if !tc.started.IsZero() {
			st := metav1.NewTime(tc.started)
			pod.Status.StartTime = &st
		}
		if got := sandboxTimeout(pod, now); got != tc.want {
			t.Errorf("%s: sandboxTimeout = %s, want %s", tc.name, got, tc.want)
		}
		if got := hasDeadline(pod); got != (tc.deadline != "" || tc.ads != nil) {
			t.Errorf("%s: hasDeadline = %v", tc.name, got)
		}
	}
}

func TestImageTemplate(t *testing.T) {
	for in, want := range map[string]string{
		"minimal":                         "minimal",
		"base:latest":                     "base",
		"registry:5000/team/python:3.12":  "python",
		"team/x@sha256:0123":              "x",
		"registry:5000/team/y:1@sha256:0": "y",
		"":                                "",
	} {
		if got := imageTemplate(in); got != want {
			t.Errorf("imageTemplate(%q) = %q, want %q", in, got, want)
		}
	}
}

// FuzzParseNetwork: the annotation is the pod author's; whatever it holds
// is either a policy or a plan error, never a panic.
func FuzzParseNetwork(f *testing.F) {
	for _, s := range []string{"", "none", "open", `{"mode":"allow","allow":["a.b"]}`, `{"mode":1}`, "{", `{} {}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		np, err := parseNetwork(s)
		var pe *planError
		if err != nil && !errors.As(err, &pe) {
			t.Fatalf("parseNetwork(%q) = %v, not a plan error", s, err)
		}
		_ = np
	})
}

// TestPlanStdin: a container's stdin, stdinOnce and tty reach its podlog
// wrapper as its FIFOs and terminal.
func TestPlanStdin(t *testing.T) {
	pod := testPod()
	c := &pod.Spec.Containers[0]
	c.Stdin, c.StdinOnce, c.TTY = true, true, true
	p, err := planPod(pod, "n")
	if err != nil {
		t.Fatal(err)
	}
	_, args := wrapArgv(p.containers[0], 2, p.containers[0].argv)
	want := []string{"podlog", "-log", podDir + "/main.log", "-exit", podDir + "/main.exit", "-run", podDir + "/main.run", "-restart", "2",
		"-stdin", podDir + "/main.stdin", "-stdin-once", "-tty", "-resize", podDir + "/main.resize", "--", "sh", "-c", "echo hi; exit 3"}
	if !slices.Equal(args, want) {
		t.Errorf("wrapper args = %q, want %q", args, want)
	}
}
