package node

import (
	"bytes"
	"encoding/json"
	"fmt"
	"path"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/client"
)

// Annotations a pod sets to choose how its sandbox is made.
const (
	// AnnotationTemplate names the Berth template; without it the
	// template is the last path element of the first container's image,
	// without tag or digest ("registry/team/base:1" → "base").
	AnnotationTemplate = "berth.dev/template"
	// AnnotationIsolation is the isolation level: runc or gvisor.
	AnnotationIsolation = "berth.dev/isolation"
	// AnnotationNetwork is the egress policy: "none" (the default),
	// "open", or a JSON network policy as the API takes it
	// ({"mode":"allow","allow":["pypi.org"]}).
	AnnotationNetwork = "berth.dev/network"
	// AnnotationEnv is the sandbox's environment, a JSON object of
	// strings: what every process in it gets (the API's create env),
	// under each container's own env.
	AnnotationEnv = "berth.dev/env"
	// AnnotationUser is the account processes in the sandbox run as
	// when a request into it names none (the API's create user; E2B
	// sandboxes run as "user").
	AnnotationUser = "berth.dev/user"
	// AnnotationAllowSudo "true" makes the sandbox with allow_sudo: sudo
	// raises a process to the sandbox's root inside its user namespace
	// (docs/security.md).
	AnnotationAllowSudo = "berth.dev/allow-sudo"
	// AnnotationDeadline is when the sandbox ends (RFC 3339): the node
	// makes it the sandbox's deadline at create and again each time the
	// annotation changes, so a deadline moved after create holds whether
	// or not a gateway runs. The pod then fails with reason
	// ReasonDeadlineExceeded.
	AnnotationDeadline = "berth.dev/deadline"
	// AnnotationLost, set by the gateway on a pod of a node it found
	// lost, says why. The node, once back, destroys such a pod's sandbox
	// and fails the pod with ReasonNodeLost: a sandbox reported lost does
	// not come back.
	AnnotationLost = "berth.dev/lost"
	// AnnotationPaused, set (to any value; the gateway writes the time of
	// the request, RFC 3339), pauses the pod's sandbox, and its removal
	// resumes it (pause.go).
	AnnotationPaused = "berth.dev/paused"
	// AnnotationOnTimeout is what the deadline (AnnotationDeadline, which
	// it needs) does: "kill" (the default: the pod fails with
	// ReasonDeadlineExceeded) or "pause" (the sandbox is paused at its
	// deadline and resumes once the deadline is moved: pause.go).
	AnnotationOnTimeout = "berth.dev/on-timeout"
	// AnnotationIdlePause (a duration, such as 15m) has the node's daemon
	// pause the sandbox once it has had no request and used under 1 %
	// of a core for that long; a moved deadline resumes it (pause.go).
	AnnotationIdlePause = "berth.dev/idle-pause"
	// AnnotationSnapshot makes the pod's sandbox from a snapshot this
	// node's daemon holds (its ID there; the gateway's snapshots.go takes
	// them): its files, and on gVisor its processes, each container
	// carrying on in the process tagged with its name where one runs.
	// Fixed at create, like the template.
	AnnotationSnapshot = "berth.dev/snapshot"
)

// Reasons a pod fails with, besides the node's Berth* ones.
const (
	// ReasonDeadlineExceeded: the sandbox's deadline passed (the
	// kubelet's reason for activeDeadlineSeconds).
	ReasonDeadlineExceeded = "DeadlineExceeded"
	// ReasonNodeLost: the gateway reported the pod's node lost.
	ReasonNodeLost = "NodeLost"
	// ReasonSettingsChanged: an annotation the sandbox was made with
	// changed on the running pod (Pods.UpdatePod).
	ReasonSettingsChanged = "BerthSettingsChanged"
)

// Labels the node puts on a pod's sandbox, so a restarted node finds its
// pods' sandboxes again.
const (
	LabelPodUID       = "berth.dev/pod-uid"
	LabelPodNamespace = "berth.dev/pod-namespace"
	LabelPodName      = "berth.dev/pod-name"
	LabelNode         = "berth.dev/node"
)

// InternalLabel says whether a sandbox or snapshot label key is one of
// Berth's own (berth.dev/…), which the node sets and no client may: an
// import drops the client's, and the gateway keeps a node's out of its
// answers.
func InternalLabel(key string) bool { return strings.HasPrefix(key, "berth.dev/") }

// TaintKey is the taint every Berth node carries (NoSchedule): only pods
// that tolerate it, sandbox pods, land there.
const TaintKey = "berth.dev/sandbox"

// podDir is where, inside the sandbox, each container's output and exit
// code are kept: they outlive the node process, so a restarted node still
// serves the logs and learns how a container ended while it was away.
const podDir = "/tmp/.berth-pod"

// plan is a pod translated to Berth: one sandbox and one process per
// container.
type plan struct {
	req        client.CreateRequest
	containers []containerPlan
	// inits are the pod's init containers, run in order, each to a
	// successful exit, before containers start (inits.go).
	inits []containerPlan
	// hostPorts are the containers' ports the node serves (hostports.go).
	hostPorts []hostPort
	// volumes are the containers' mounts of emptyDir volumes
	// (volumes.go), in container order.
	volumes []volumeMount
	// files are its configMap and secret volumes, filled at start.
	files []fileVolume
}

type containerPlan struct {
	name string
	// argv is command then args; empty means the container has no
	// process of its own and runs as long as the sandbox does.
	argv []string
	env  map[string]string
	// vars are its env entries in order, and envFrom its environment
	// from ConfigMaps and Secrets, resolved as it starts (env.go).
	vars    []envRef
	envFrom []corev1.EnvFromSource
	cwd     string
	// probes are its startup, liveness and readiness probes (probe.go).
	probes containerProbes
	// sidecar: an init container with restartPolicy Always (inits.go),
	// which starts among the init containers and runs beside the
	// containers, restarted whenever it ends.
	sidecar bool
	// stdin, stdinOnce and tty are the container's own: kubectl attach
	// -i writes to its stdin, on its terminal with tty (stream.go).
	stdin, stdinOnce, tty bool
}

// followed are the containers whose runs the node follows and restarts:
// the sidecars, in order, then the containers.
func (p plan) followed() []containerPlan {
	var out []containerPlan
	for _, c := range p.inits {
		if c.sidecar {
			out = append(out, c)
		}
	}
	return append(out, p.containers...)
}

// restartPolicy is container c's: Always for a sidecar, the pod's for
// the others.
func (c containerPlan) restartPolicy(pod corev1.RestartPolicy) corev1.RestartPolicy {
	if c.sidecar {
		return corev1.RestartPolicyAlways
	}
	return pod
}

// names are the pod's init containers' and containers' names.
func (p plan) names() []string {
	var out []string
	for _, c := range append(slices.Clone(p.inits), p.containers...) {
		out = append(out, c.name)
	}
	return out
}

// planError is a pod Berth cannot run as asked; the pod fails with it.
type planError struct {
	field string
	msg   string
}

func (e *planError) Error() string { return e.field + ": " + e.msg }

var (
	dnsLabel = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)
	// Label values Berth accepts (internal/sandbox's validLabel).
	labelValue = regexp.MustCompile(`^[A-Za-z0-9._/-]{1,63}$`)
)

// planPod translates a pod bound to nodeName into a sandbox create request
// and the processes to start in it.
func planPod(pod *corev1.Pod, nodeName string) (plan, error) {
	var p plan
	spec := &pod.Spec
	if len(spec.Containers) == 0 {
		return p, &planError{"spec.containers", "a pod needs at least one container"}
	}
	for k, v := range map[string]string{"metadata.uid": string(pod.UID), "metadata.namespace": pod.Namespace, "metadata.name": pod.Name, "spec.nodeName": nodeName} {
		if !labelValue.MatchString(v) {
			return p, &planError{k, fmt.Sprintf("%q is longer than 63 characters or has characters a Berth label cannot hold", v)}
		}
	}
	p.req.Labels = map[string]string{
		LabelPodUID:       string(pod.UID),
		LabelPodNamespace: pod.Namespace,
		LabelPodName:      pod.Name,
		LabelNode:         nodeName,
	}
	tpl := pod.Annotations[AnnotationTemplate]
	if tpl == "" {
		tpl = imageTemplate(spec.Containers[0].Image)
	}
	if tpl == "" {
		return p, &planError{"spec.containers[0].image", fmt.Sprintf("image %q names no template; set the %s annotation", spec.Containers[0].Image, AnnotationTemplate)}
	}
	p.req.Template = tpl
	if v := pod.Annotations[AnnotationSnapshot]; v != "" {
		if err := types.ValidSandboxID(v); err != nil {
			return p, &planError{"metadata.annotations[" + AnnotationSnapshot + "]", fmt.Sprintf("%q: want a snapshot ID of this node's daemon", v)}
		}
		p.req.Snapshot = v
	}
	switch iso := pod.Annotations[AnnotationIsolation]; iso {
	case "", client.IsolationRunc, client.IsolationGVisor:
		p.req.Isolation = iso
	default:
		return p, &planError{"metadata.annotations[" + AnnotationIsolation + "]", fmt.Sprintf("%q: want runc or gvisor", iso)}
	}
	netp, err := parseNetwork(pod.Annotations[AnnotationNetwork])
	if err != nil {
		return p, err
	}
	p.req.Network = netp
	if s := pod.Annotations[AnnotationEnv]; s != "" {
		if err := json.Unmarshal([]byte(s), &p.req.Env); err != nil {
			return p, &planError{"metadata.annotations[" + AnnotationEnv + "]", "want a JSON object of strings: " + err.Error()}
		}
	}
	p.req.User = pod.Annotations[AnnotationUser]
	switch v := pod.Annotations[AnnotationAllowSudo]; v {
	case "":
	case "true", "false":
		sudo := v == "true"
		p.req.AllowSudo = &sudo
	default:
		return p, &planError{"metadata.annotations[" + AnnotationAllowSudo + "]", fmt.Sprintf("%q: want true or false", v)}
	}
	dl, err := podDeadline(pod)
	if err != nil {
		return p, err
	}
	switch v := pod.Annotations[AnnotationOnTimeout]; v {
	case "", client.OnTimeoutKill:
	case client.OnTimeoutPause:
		if dl.IsZero() {
			return p, &planError{"metadata.annotations[" + AnnotationOnTimeout + "]", "pause needs a deadline (" + AnnotationDeadline + ")"}
		}
		p.req.OnTimeout = v
	default:
		return p, &planError{"metadata.annotations[" + AnnotationOnTimeout + "]", fmt.Sprintf("%q: want kill or pause", v)}
	}
	if v := pod.Annotations[AnnotationIdlePause]; v != "" {
		d, err := time.ParseDuration(v)
		switch {
		case err != nil || d < time.Second:
			return p, &planError{"metadata.annotations[" + AnnotationIdlePause + "]", fmt.Sprintf("%q: want a duration of at least 1s, such as 15m", v)}
		case dl.IsZero():
			return p, &planError{"metadata.annotations[" + AnnotationIdlePause + "]", "an idle pause needs a deadline (" + AnnotationDeadline + ")"}
		}
		p.req.IdlePause = d.String()
	}
	if d := spec.ActiveDeadlineSeconds; d != nil && *d <= 0 {
		return p, &planError{"spec.activeDeadlineSeconds", "must be positive"}
	}
	p.req.Timeout = strconv.FormatInt(int64(sandboxTimeout(pod, time.Now())/time.Second), 10) + "s"

	var cpuMilli, memBytes int64
	addHostPorts := func(field string, c corev1.Container) error {
		hps, err := planHostPorts(field, c)
		if err != nil {
			return err
		}
		for _, hp := range hps {
			if slices.ContainsFunc(p.hostPorts, func(o hostPort) bool { return o.addr == hp.addr && o.udp == hp.udp }) {
				return &planError{hp.field + ".hostPort", fmt.Sprintf("%s is asked for twice", hp.addr)}
			}
			p.hostPorts = append(p.hostPorts, hp)
		}
		return nil
	}
	for i, c := range spec.Containers {
		field := fmt.Sprintf("spec.containers[%d]", i)
		cp, cpu, mem, err := planContainer(field, c, *spec, false)
		if err != nil {
			return p, err
		}
		cpuMilli += cpu
		memBytes += mem
		p.containers = append(p.containers, cp)
		if err := addHostPorts(field, c); err != nil {
			return p, err
		}
	}
	// Init containers run one at a time before the others, each beside
	// the sidecars started before it, and the sidecars run beside the
	// containers: the sandbox needs the most any init container asks
	// for plus the sidecars before it, or the containers' sum plus
	// every sidecar's (the kubelet's effective pod request).
	var sideCPU, sideMem int64
	for i, c := range spec.InitContainers {
		field := fmt.Sprintf("spec.initContainers[%d]", i)
		cp, cpu, mem, err := planContainer(field, c, *spec, true)
		if err != nil {
			return p, err
		}
		p.inits = append(p.inits, cp)
		if !cp.sidecar {
			cpuMilli, memBytes = max(cpuMilli, sideCPU+cpu), max(memBytes, sideMem+mem)
			continue
		}
		if err := addHostPorts(field, c); err != nil {
			return p, err
		}
		sideCPU, sideMem = sideCPU+cpu, sideMem+mem
		cpuMilli, memBytes = cpuMilli+cpu, memBytes+mem
	}
	mounts, files, err := planVolumes(spec)
	if err != nil {
		return p, err
	}
	p.volumes, p.files = mounts, files
	if cpuMilli > 0 {
		p.req.CPU = float64(cpuMilli) / 1000
	}
	if memBytes > 0 {
		p.req.Memory = strconv.FormatInt(memBytes, 10)
	}
	return p, nil
}

// containerNames are the names of the pod's containers, init containers
// included.
func containerNames(spec corev1.PodSpec) map[string]bool {
	names := map[string]bool{}
	for _, c := range append(slices.Clone(spec.InitContainers), spec.Containers...) {
		names[c.Name] = true
	}
	return names
}

// planContainer translates one container (init: an init container) and
// returns the CPU (millicores) and memory (bytes) it counts for.
func planContainer(field string, c corev1.Container, spec corev1.PodSpec, init bool) (containerPlan, int64, int64, error) {
	cp := containerPlan{name: c.Name, cwd: c.WorkingDir}
	if !dnsLabel.MatchString(c.Name) {
		return cp, 0, 0, &planError{field + ".name", fmt.Sprintf("%q is not a DNS label", c.Name)}
	}
	cp.stdin, cp.stdinOnce, cp.tty = c.Stdin, c.StdinOnce, c.TTY
	// Limits bound the sandbox; requests stand in where a container
	// sets no limit (they are what the scheduler counted).
	cpu, mem := c.Resources.Limits.Cpu(), c.Resources.Limits.Memory()
	if cpu.IsZero() {
		cpu = c.Resources.Requests.Cpu()
	}
	if mem.IsZero() {
		mem = c.Resources.Requests.Memory()
	}
	cp.argv = append(append(cp.argv, c.Command...), c.Args...)
	if (c.Stdin || c.TTY) && len(cp.argv) == 0 {
		return cp, 0, 0, &planError{field + ".command", "a container with stdin or a terminal needs a command on Berth nodes (one without runs no process of its own)"}
	}
	if init {
		switch {
		case c.RestartPolicy != nil && *c.RestartPolicy != corev1.ContainerRestartPolicyAlways:
			return cp, 0, 0, &planError{field + ".restartPolicy", fmt.Sprintf("%q: an init container's may only be Always (a sidecar)", *c.RestartPolicy)}
		case len(cp.argv) == 0:
			return cp, 0, 0, &planError{field + ".command", "an init container needs a command: a Berth template has no entrypoint to run"}
		case c.RestartPolicy == nil && (c.StartupProbe != nil || c.LivenessProbe != nil || c.ReadinessProbe != nil):
			return cp, 0, 0, &planError{field, "init containers cannot have probes (only sidecars, restartPolicy Always)"}
		}
		cp.sidecar = c.RestartPolicy != nil
	}
	if !init || cp.sidecar {
		probes, err := parseProbes(field, c, spec, len(cp.argv) > 0)
		if err != nil {
			return cp, 0, 0, err
		}
		cp.probes = probes
	}
	for j, e := range c.Env {
		if e.ValueFrom != nil {
			if err := checkEnvSource(fmt.Sprintf("%s.env[%d].valueFrom", field, j), e.ValueFrom, containerNames(spec), c.Name); err != nil {
				return cp, 0, 0, err
			}
			cp.vars = append(cp.vars, envRef{name: e.Name, src: e.ValueFrom.DeepCopy()})
			continue
		}
		cp.vars = append(cp.vars, envRef{name: e.Name, value: e.Value})
		if cp.env == nil {
			cp.env = map[string]string{}
		}
		cp.env[e.Name] = e.Value
	}
	for j, ef := range c.EnvFrom {
		if ef.ConfigMapRef == nil && ef.SecretRef == nil {
			return cp, 0, 0, &planError{fmt.Sprintf("%s.envFrom[%d]", field, j), "want a configMapRef or a secretRef"}
		}
		cp.envFrom = append(cp.envFrom, *ef.DeepCopy())
	}
	return cp, cpu.MilliValue(), mem.Value(), nil
}

// settingsChange says which of the settings a sandbox was made with
// (running plans) the pod now states otherwise, "" when none; a pod that
// no longer plans at all says why. The network policy is not among them:
// a running sandbox's changes (applyNetwork).
func settingsChange(running plan, pod *corev1.Pod) string {
	pod = pod.DeepCopy()
	delete(pod.Annotations, AnnotationNetwork)
	now, err := planPod(pod, running.req.Labels[LabelNode])
	if err != nil {
		return err.Error()
	}
	diff := slices.DeleteFunc(changedSettings(running.req, now.req), func(s string) bool { return s == "network" })
	if len(diff) == 0 {
		return ""
	}
	return "the sandbox was made with another " + strings.Join(diff, ", ") + " than its pod now states; a running sandbox's cannot change"
}

// SettingsChange says which settings of the sandbox a pod like was would
// make (template, isolation, network, env, user, allow_sudo: the create
// request's names) a pod like now states otherwise; nil when none. The
// gateway asks it before a SandboxClaim may hand over a warm pod.
func SettingsChange(was, now *corev1.Pod) ([]string, error) {
	a, err := planPod(was, "node")
	if err != nil {
		return nil, err
	}
	b, err := planPod(now, "node")
	if err != nil {
		return nil, err
	}
	return changedSettings(a.req, b.req), nil
}

// changedSettings names the settings fixed at a sandbox's create that b
// states otherwise than a.
func changedSettings(a, b client.CreateRequest) []string {
	var diff []string
	for _, d := range []struct {
		name      string
		was, want any
	}{
		{"template", a.Template, b.Template},
		{"isolation", a.Isolation, b.Isolation},
		{"network", netKey(a.Network), netKey(b.Network)},
		{"env", envKey(a.Env), envKey(b.Env)},
		{"user", a.User, b.User},
		{"allow_sudo", a.AllowSudo, b.AllowSudo},
		{"on_timeout", a.OnTimeout, b.OnTimeout},
		{"idle_pause", a.IdlePause, b.IdlePause},
		{"snapshot", a.Snapshot, b.Snapshot},
	} {
		if !reflect.DeepEqual(d.was, d.want) {
			diff = append(diff, d.name)
		}
	}
	return diff
}

// netKey is a network policy to compare: none written any way is nil.
func netKey(np *client.NetworkPolicy) *client.NetworkPolicy {
	if np == nil || (np.Mode == "" || np.Mode == "none") && len(np.Allow)+len(np.Deny)+len(np.HTTP) == 0 {
		return nil
	}
	return np
}

// envKey is an environment to compare: empty is nil.
func envKey(env map[string]string) map[string]string {
	if len(env) == 0 {
		return nil
	}
	return env
}

// imageTemplate is the template an image reference names: its last path
// element without tag or digest.
func imageTemplate(image string) string {
	ref, _, _ := strings.Cut(image, "@")
	ref = path.Base(ref)
	if i := strings.LastIndexByte(ref, ':'); i >= 0 {
		ref = ref[:i]
	}
	if ref == "." || ref == "/" {
		return ""
	}
	return ref
}

// parseNetwork reads the network annotation.
func parseNetwork(s string) (*client.NetworkPolicy, error) {
	field := "metadata.annotations[" + AnnotationNetwork + "]"
	switch s = strings.TrimSpace(s); {
	case s == "" || s == "none":
		return nil, nil
	case s == "open":
		return &client.NetworkPolicy{Mode: "open"}, nil
	case strings.HasPrefix(s, "{"):
		var np client.NetworkPolicy
		dec := json.NewDecoder(bytes.NewReader([]byte(s)))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&np); err != nil {
			return nil, &planError{field, "not a network policy: " + err.Error()}
		}
		if dec.More() {
			return nil, &planError{field, "trailing data after the policy"}
		}
		return &np, nil
	}
	return nil, &planError{field, fmt.Sprintf("%q: want none, open, or a JSON network policy", s)}
}

// agentPath is where every sandbox has the agent binary
// (internal/runtime/runc's agentMount).
const agentPath = "/.berth/berth-agent"

// wrapArgv is the process a container runs as: its own argv under the
// agent's podlog wrapper, which writes the output to the container's log
// as CRI records (each line timed, for --since and --timestamps), the
// run's record (restart count, start time) to its run file, and the exit
// code to its exit file once it ends; restart is the run's restart count.
// A container with stdin reads it from its stdin FIFO, one with a
// terminal runs on one, sized through its resize FIFO.
func wrapArgv(c containerPlan, restart int, argv []string) (string, []string) {
	args := []string{"podlog", "-log", logPath(c.name), "-exit", exitPath(c.name),
		"-run", runPath(c.name), "-restart", strconv.Itoa(restart)}
	if c.stdin {
		args = append(args, "-stdin", stdinPath(c.name))
		if c.stdinOnce {
			args = append(args, "-stdin-once")
		}
	}
	if c.tty {
		args = append(args, "-tty", "-resize", resizePath(c.name))
	}
	return agentPath, append(append(args, "--"), argv...)
}

// rotateArgv keeps a container's last run's files as its previous run's,
// for --previous: the node runs it before it restarts the container.
func rotateArgv(name string) (string, []string) {
	return agentPath, []string{"podlog", "-rotate", "-log", logPath(name), "-exit", exitPath(name), "-run", runPath(name)}
}

// logPath, exitPath and runPath are a container's log, exit code and run
// record in its sandbox; its previous run's are beside them, with the
// suffix crilog.Previous.
func logPath(name string) string  { return podDir + "/" + name + ".log" }
func exitPath(name string) string { return podDir + "/" + name + ".exit" }
func runPath(name string) string  { return podDir + "/" + name + ".run" }

// stdinPath and resizePath are the FIFOs of a container's stdin and of
// its terminal's size (berth-agent podlog -stdin, -resize).
func stdinPath(name string) string  { return podDir + "/" + name + ".stdin" }
func resizePath(name string) string { return podDir + "/" + name + ".resize" }

// processTag names a container's process in the agent's process table.
func processTag(name string) string { return "berth-pod/" + name }

// podDeadline is the pod's AnnotationDeadline, zero without one.
func podDeadline(pod *corev1.Pod) (time.Time, error) {
	v := pod.Annotations[AnnotationDeadline]
	if v == "" {
		return time.Time{}, nil
	}
	t, err := time.Parse(time.RFC3339, v)
	if err != nil {
		return time.Time{}, &planError{"metadata.annotations[" + AnnotationDeadline + "]", fmt.Sprintf("%q: want an RFC 3339 time", v)}
	}
	return t, nil
}

// sandboxTimeout is the timeout, from now, the pod's sandbox is made with
// or set to. A pod lives until Kubernetes deletes it, so without a
// deadline it is podLease, which the node renews; AnnotationDeadline and
// activeDeadlineSeconds (from the pod's start) bound it, the earlier
// winning. A deadline already past still gives the daemon's shortest
// timeout, one second: the sandbox ends at once, through its deadline.
func sandboxTimeout(pod *corev1.Pod, now time.Time) time.Duration {
	d := podLease
	if ads := pod.Spec.ActiveDeadlineSeconds; ads != nil && *ads > 0 {
		end := now.Add(time.Duration(*ads) * time.Second)
		if st := pod.Status.StartTime; st != nil {
			end = st.Add(time.Duration(*ads) * time.Second)
		}
		d = min(d, end.Sub(now))
	}
	if t, err := podDeadline(pod); err == nil && !t.IsZero() {
		d = min(d, t.Sub(now))
	}
	// Rounded up: the sandbox ends at the deadline or just after, never
	// before it.
	if r := d.Truncate(time.Second); r != d {
		d = r + time.Second
	}
	return max(time.Second, d)
}

// hasDeadline says whether the pod bounds its sandbox's life, so the node
// does not renew it to podLease.
func hasDeadline(pod *corev1.Pod) bool {
	return pod.Spec.ActiveDeadlineSeconds != nil || pod.Annotations[AnnotationDeadline] != ""
}
