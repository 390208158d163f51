package node

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// A container's environment from elsewhere, resolved as a kubelet
// resolves it, each time the container starts: envFrom (every key of a
// ConfigMap or Secret, behind a prefix), then the container's literal
// env, then its env valueFrom (a ConfigMap's or Secret's key, or a field
// of the pod). The node reads the ConfigMaps and Secrets of the pod's
// namespace through its API client when the container starts. A missing
// one (or key) that is not optional holds the start, as on a kubelet: the
// container waits with CreateContainerConfigError and the message naming
// it, and the node reads again, after 1 s, then twice as long each time
// up to configRetryMax, until it is there (configError, awaitConfig).
// Secrets' values reach the container's process only (its environment),
// as on a kubelet.

// configError is a ConfigMap or Secret (or a key of one) that a pod
// needs and its namespace does not have yet: the start waits for it.
type configError struct{ msg string }

func (e *configError) Error() string { return e.msg }

// The waits between reads of a pod's missing ConfigMaps and Secrets.
const (
	configRetry    = time.Second
	configRetryMax = 10 * time.Second
)

// Waiting reasons of a container whose start waits for its configuration.
const (
	reasonConfigError = "CreateContainerConfigError"
)

// awaitConfig runs read until it returns no configError: meanwhile every
// named container waits with reason and the error as message. It returns
// read's other error, or ctx's.
func (p *Pods) awaitConfig(ctx context.Context, ps *podState, names []string, reason string, read func() error) error {
	wait := configRetry
	for waited := false; ; waited = true {
		err := read()
		ce, ok := err.(*configError)
		if !ok {
			if waited {
				for _, n := range names {
					p.setContainer(ps, n, func(cs *containerState) { cs.waitReason, cs.waitMessage = "", "" })
				}
			}
			return err
		}
		for _, n := range names {
			p.setContainer(ps, n, func(cs *containerState) { cs.waitReason, cs.waitMessage = reason, ce.msg })
		}
		p.log.Info("pod_config_missing", "pod", key(ps.pod.Namespace, ps.pod.Name), "containers", names, "err", ce.msg, "retry_in", wait)
		if !sleepCtx(ctx, wait) {
			return ctx.Err()
		}
		wait = min(2*wait, configRetryMax)
	}
}

// envRef is one env entry: a value, or (src) where it comes from.
type envRef struct {
	name, value string
	src         *corev1.EnvVarSource
}

// envFieldPaths are the pod fields an env fieldRef may name (labels and
// annotations by key too, fieldLabel below).
var envFieldPaths = map[string]bool{
	"metadata.name": true, "metadata.namespace": true, "metadata.uid": true,
	"spec.nodeName": true, "spec.serviceAccountName": true, "status.hostIP": true, "status.podIP": true,
}

var fieldLabel = regexp.MustCompile(`^metadata\.(labels|annotations)\['([^']+)'\]$`)

// envVarName is what a kubelet takes as a variable name from a
// ConfigMap's or Secret's keys in envFrom; other keys are skipped.
var envVarName = regexp.MustCompile(`^[-._a-zA-Z][-._a-zA-Z0-9]*$`)

// checkEnvSource refuses at plan what the node cannot resolve.
// containers are the pod's containers' names, self the variable's.
func checkEnvSource(field string, s *corev1.EnvVarSource, containers map[string]bool, self string) error {
	switch {
	case s.ConfigMapKeyRef != nil, s.SecretKeyRef != nil:
		return nil
	case s.FieldRef != nil:
		if envFieldPaths[s.FieldRef.FieldPath] || fieldLabel.MatchString(s.FieldRef.FieldPath) {
			return nil
		}
		return &planError{field + ".fieldRef.fieldPath", fmt.Sprintf("%q is not a field a Berth node resolves", s.FieldRef.FieldPath)}
	case s.ResourceFieldRef != nil:
		return checkResourceRef(field+".resourceFieldRef", s.ResourceFieldRef, containers, self)
	}
	return &planError{field, "unsupported or empty reference"}
}

// containerEnv is the environment container c starts with, and its
// command and arguments with $(VAR) references expanded (expand).
func (p *Pods) containerEnv(ctx context.Context, ps *podState, c containerPlan) (map[string]string, []string, error) {
	plain := p.services == nil && len(c.envFrom) == 0 && !slices.ContainsFunc(c.vars, func(v envRef) bool { return v.src != nil || strings.Contains(v.value, "$") }) &&
		!slices.ContainsFunc(c.argv, func(a string) bool { return strings.Contains(a, "$") })
	if plain {
		return c.env, c.argv, nil
	}
	env, err := p.resolveEnv(ctx, ps, c)
	if err != nil {
		return nil, nil, err
	}
	argv := make([]string, len(c.argv))
	for i, a := range c.argv {
		argv[i] = expand(a, env)
	}
	return env, argv, nil
}

// resolveEnv is container c's environment: envFrom, then its env entries
// in order, each value's $(VAR) references expanded against what came
// before it.
func (p *Pods) resolveEnv(ctx context.Context, ps *podState, c containerPlan) (map[string]string, error) {
	if p.kube == nil && (len(c.envFrom) > 0 || slices.ContainsFunc(c.vars, func(v envRef) bool { return v.src != nil && v.src.FieldRef == nil && v.src.ResourceFieldRef == nil })) {
		return nil, fmt.Errorf("environment from ConfigMaps or Secrets: the node has no API client")
	}
	p.mu.Lock()
	pod := ps.pod.DeepCopy()
	podIP, id := ps.podIP, ps.sandboxID
	p.mu.Unlock()
	size := p.sizeOnce(ctx, id)
	objs := &podObjects{kube: p.kube, ns: pod.Namespace}
	env := p.serviceEnv(pod)
	for _, ef := range c.envFrom {
		kind, name, opt := "secret", "", false
		if r := ef.ConfigMapRef; r != nil {
			kind, name, opt = "configmap", r.Name, ptr.Deref(r.Optional, false)
		} else if r := ef.SecretRef; r != nil {
			name, opt = r.Name, ptr.Deref(r.Optional, false)
		}
		data, found, err := objs.data(ctx, kind, name)
		switch {
		case err != nil:
			return nil, err
		case !found && opt:
			continue
		case !found:
			return nil, &configError{fmt.Sprintf("envFrom: %s %q not found in namespace %s", kind, name, pod.Namespace)}
		}
		for k, v := range data {
			if envVarName.MatchString(ef.Prefix + k) {
				env[ef.Prefix+k] = string(v)
			}
		}
	}
	for _, r := range c.vars {
		kind, name, key, opt := "", "", "", false
		switch s := r.src; {
		case s == nil:
			env[r.name] = expand(r.value, env)
			continue
		case s.FieldRef != nil:
			env[r.name] = podField(pod, s.FieldRef.FieldPath, p.node, p.ip, podIP)
			continue
		case s.ResourceFieldRef != nil:
			v, err := resourceValue(pod, s.ResourceFieldRef, c.name, size)
			if err != nil {
				return nil, err
			}
			env[r.name] = v
			continue
		case s.ConfigMapKeyRef != nil:
			kind, name, key, opt = "configmap", s.ConfigMapKeyRef.Name, s.ConfigMapKeyRef.Key, ptr.Deref(s.ConfigMapKeyRef.Optional, false)
		case s.SecretKeyRef != nil:
			kind, name, key, opt = "secret", s.SecretKeyRef.Name, s.SecretKeyRef.Key, ptr.Deref(s.SecretKeyRef.Optional, false)
		}
		data, _, err := objs.data(ctx, kind, name)
		if err != nil {
			return nil, err
		}
		v, ok := data[key]
		switch {
		case ok:
			env[r.name] = string(v)
		case !opt:
			return nil, &configError{fmt.Sprintf("env %s: key %q of %s %q not found in namespace %s", r.name, key, kind, name, pod.Namespace)}
		}
	}
	return env, nil
}

// podObjects reads ConfigMaps and Secrets of a pod's namespace, each
// once, as their keys' bytes.
type podObjects struct {
	kube kubernetes.Interface
	ns   string
	seen map[string]map[string][]byte // "kind/name": data, nil when absent
}

// data is the keys of the ConfigMap (its data and binaryData) or Secret
// name; found is false when there is none.
func (o *podObjects) data(ctx context.Context, kind, name string) (map[string][]byte, bool, error) {
	if d, ok := o.seen[kind+"/"+name]; ok {
		return d, d != nil, nil
	}
	var d map[string][]byte
	var err error
	if kind == "configmap" {
		var cm *corev1.ConfigMap
		if cm, err = o.kube.CoreV1().ConfigMaps(o.ns).Get(ctx, name, metav1.GetOptions{}); err == nil {
			d = map[string][]byte{}
			for k, v := range cm.Data {
				d[k] = []byte(v)
			}
			maps.Copy(d, cm.BinaryData)
		}
	} else {
		var s *corev1.Secret
		if s, err = o.kube.CoreV1().Secrets(o.ns).Get(ctx, name, metav1.GetOptions{}); err == nil {
			d = s.Data
			if d == nil {
				d = map[string][]byte{}
			}
		}
	}
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return nil, false, fmt.Errorf("%s %s/%s: %w", kind, o.ns, name, err)
	}
	if o.seen == nil {
		o.seen = map[string]map[string][]byte{}
	}
	o.seen[kind+"/"+name] = d
	return d, d != nil, nil
}

// serviceEnv is the Services' variables a kubelet gives every container,
// under its own: the default namespace's "kubernetes" Service's always,
// and each Service of the pod's namespace unless the pod turned
// enableServiceLinks off. A Service without a cluster IP has none.
func (p *Pods) serviceEnv(pod *corev1.Pod) map[string]string {
	env := map[string]string{}
	if p.services == nil {
		return env
	}
	links := pod.Spec.EnableServiceLinks == nil || *pod.Spec.EnableServiceLinks
	var svcs []*corev1.Service
	if links {
		if l, err := p.services.Services(pod.Namespace).List(labels.Everything()); err == nil {
			svcs = l
		}
	}
	if k, err := p.services.Services(metav1.NamespaceDefault).Get("kubernetes"); err == nil {
		svcs = append(slices.DeleteFunc(svcs, func(s *corev1.Service) bool { return s.Name == "kubernetes" }), k)
	}
	for _, s := range svcs {
		ip := s.Spec.ClusterIP
		if ip == "" || ip == corev1.ClusterIPNone || len(s.Spec.Ports) == 0 {
			continue
		}
		name := strings.ToUpper(strings.ReplaceAll(s.Name, "-", "_"))
		env[name+"_SERVICE_HOST"] = ip
		env[name+"_SERVICE_PORT"] = strconv.Itoa(int(s.Spec.Ports[0].Port))
		for i, sp := range s.Spec.Ports {
			port := strconv.Itoa(int(sp.Port))
			if sp.Name != "" {
				env[name+"_SERVICE_PORT_"+strings.ToUpper(strings.ReplaceAll(sp.Name, "-", "_"))] = port
			}
			proto := string(cmp.Or(sp.Protocol, corev1.ProtocolTCP))
			url := strings.ToLower(proto) + "://" + net.JoinHostPort(ip, port)
			if i == 0 {
				env[name+"_PORT"] = url
			}
			pp := name + "_PORT_" + port + "_" + strings.ToUpper(proto)
			env[pp] = url
			env[pp+"_PROTO"] = strings.ToLower(proto)
			env[pp+"_PORT"] = port
			env[pp+"_ADDR"] = ip
		}
	}
	return env
}

// expand replaces each $(VAR) in s with VAR's value in env, as a kubelet
// expands a container's env values, command and arguments: $$ is a
// literal $, and a reference to a variable that is not set, or that is
// not closed, stays as written.
func expand(s string, env map[string]string) string {
	if !strings.Contains(s, "$") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 == len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch s[i+1] {
		case '$':
			b.WriteByte('$')
			i++
		case '(':
			end := strings.IndexByte(s[i+2:], ')')
			if end < 0 {
				b.WriteString(s[i:])
				return b.String()
			}
			name := s[i+2 : i+2+end]
			if v, ok := env[name]; ok {
				b.WriteString(v)
			} else {
				b.WriteString(s[i : i+3+end])
			}
			i += 2 + end
		default:
			b.WriteByte('$')
		}
	}
	return b.String()
}

// podField is the value of an env fieldRef (checkEnvSource took it).
func podField(pod *corev1.Pod, path, node, hostIP, podIP string) string {
	if m := fieldLabel.FindStringSubmatch(path); m != nil {
		if m[1] == "labels" {
			return pod.Labels[m[2]]
		}
		return pod.Annotations[m[2]]
	}
	switch path {
	case "metadata.name":
		return pod.Name
	case "metadata.namespace":
		return pod.Namespace
	case "metadata.uid":
		return string(pod.UID)
	case "spec.nodeName":
		return node
	case "spec.serviceAccountName":
		return pod.Spec.ServiceAccountName
	case "status.hostIP":
		return hostIP
	case "status.podIP":
		return podIP
	}
	return ""
}

// volumeFile is one file of a file volume.
type volumeFile struct {
	path string
	data []byte
	mode int32
}

// volumeFiles are the files of an object's data: the items named (each
// at its path, with its mode or the default), or every key. missing, when
// set, names the object, and a key an item names that it lacks is an
// error; unset (optional), such an item is skipped. The items' paths
// were checked at plan (checkItems): relative, inside the volume.
func volumeFiles(data map[string][]byte, items []corev1.KeyToPath, defaultMode *int32, missing string) ([]volumeFile, error) {
	mode := fileMode(defaultMode, nil)
	var out []volumeFile
	if len(items) == 0 {
		for _, k := range slices.Sorted(maps.Keys(data)) {
			out = append(out, volumeFile{path: k, data: data[k], mode: mode})
		}
		return out, nil
	}
	for _, it := range items {
		v, ok := data[it.Key]
		if !ok {
			if missing != "" {
				return nil, &configError{fmt.Sprintf("%s has no key %q", missing, it.Key)}
			}
			continue
		}
		out = append(out, volumeFile{path: it.Path, data: v, mode: fileMode(&mode, it.Mode)})
	}
	return out, nil
}
