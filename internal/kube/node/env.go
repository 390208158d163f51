package node

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/berth-sandbox/berth/client"
)

// A container's environment from elsewhere, resolved as a kubelet
// resolves it, each time the container starts: envFrom (every key of a
// ConfigMap or Secret, behind a prefix), then the container's literal
// env, then its env valueFrom (a ConfigMap's or Secret's key, or a field
// of the pod). The node reads the ConfigMaps and Secrets of the pod's
// namespace through its API client when the container starts; a missing
// one (or key) that is not optional fails the start, naming it. Secrets'
// values reach the container's process only (its environment), as on a
// kubelet.

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
func checkEnvSource(field string, s *corev1.EnvVarSource) error {
	switch {
	case s.ConfigMapKeyRef != nil, s.SecretKeyRef != nil:
		return nil
	case s.FieldRef != nil:
		if envFieldPaths[s.FieldRef.FieldPath] || fieldLabel.MatchString(s.FieldRef.FieldPath) {
			return nil
		}
		return &planError{field + ".fieldRef.fieldPath", fmt.Sprintf("%q is not a field a Berth node resolves", s.FieldRef.FieldPath)}
	case s.ResourceFieldRef != nil:
		return &planError{field + ".resourceFieldRef", "resource fields are not supported on Berth nodes"}
	}
	return &planError{field, "unsupported or empty reference"}
}

// containerEnv is the environment container c starts with, and its
// command and arguments with $(VAR) references expanded (expand).
func (p *Pods) containerEnv(ctx context.Context, ps *podState, c containerPlan) (map[string]string, []string, error) {
	plain := len(c.envFrom) == 0 && !slices.ContainsFunc(c.vars, func(v envRef) bool { return v.src != nil || strings.Contains(v.value, "$") }) &&
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
	if p.kube == nil && (len(c.envFrom) > 0 || slices.ContainsFunc(c.vars, func(v envRef) bool { return v.src != nil && v.src.FieldRef == nil })) {
		return nil, fmt.Errorf("environment from ConfigMaps or Secrets: the node has no API client")
	}
	p.mu.Lock()
	pod := ps.pod.DeepCopy()
	podIP := ps.podIP
	p.mu.Unlock()
	objs := &podObjects{kube: p.kube, ns: pod.Namespace}
	optional := func(b *bool) bool { return b != nil && *b }
	env := map[string]string{}
	for _, ef := range c.envFrom {
		kind, name, opt := "secret", "", false
		if r := ef.ConfigMapRef; r != nil {
			kind, name, opt = "configmap", r.Name, optional(r.Optional)
		} else if r := ef.SecretRef; r != nil {
			name, opt = r.Name, optional(r.Optional)
		}
		data, found, err := objs.data(ctx, kind, name)
		switch {
		case err != nil:
			return nil, err
		case !found && opt:
			continue
		case !found:
			return nil, fmt.Errorf("envFrom: %s %q not found in namespace %s", kind, name, pod.Namespace)
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
		case s.ConfigMapKeyRef != nil:
			kind, name, key, opt = "configmap", s.ConfigMapKeyRef.Name, s.ConfigMapKeyRef.Key, optional(s.ConfigMapKeyRef.Optional)
		case s.SecretKeyRef != nil:
			kind, name, key, opt = "secret", s.SecretKeyRef.Name, s.SecretKeyRef.Key, optional(s.SecretKeyRef.Optional)
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
			return nil, fmt.Errorf("env %s: key %q of %s %q not found in namespace %s", r.name, key, kind, name, pod.Namespace)
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

// fillVolumes writes the pod's configMap and secret volumes into their
// directories (home, by volume) in sandbox id, as the sandbox's root:
// every key of the object, or the items named (a missing key fails the
// pod unless the volume is optional), mode defaultMode (0644 unless set)
// or the item's. They are copies, written once when the sandbox is made:
// a later change of the object does not reach them (a kubelet updates
// its mounts), and a process of the sandbox can change them.
func (p *Pods) fillVolumes(ctx context.Context, ps *podState, id string, home map[string]string) error {
	if len(ps.plan.files) == 0 {
		return nil
	}
	if p.kube == nil {
		return fmt.Errorf("configMap and secret volumes: the node has no API client")
	}
	objs := &podObjects{kube: p.kube, ns: ps.pod.Namespace}
	for _, v := range ps.plan.files {
		dir, ok := home[v.name]
		if !ok {
			continue // mounted by no container
		}
		kind, name, items, mode, opt := "secret", "", []corev1.KeyToPath(nil), (*int32)(nil), (*bool)(nil)
		if cm := v.configMap; cm != nil {
			kind, name, items, mode, opt = "configmap", cm.Name, cm.Items, cm.DefaultMode, cm.Optional
		} else if s := v.secret; s != nil {
			name, items, mode, opt = s.SecretName, s.Items, s.DefaultMode, s.Optional
		}
		optional := opt != nil && *opt
		data, found, err := objs.data(ctx, kind, name)
		switch {
		case err != nil:
			return fmt.Errorf("volume %s: %w", v.name, err)
		case !found && optional:
			continue
		case !found:
			return fmt.Errorf("volume %s: %s %s/%s not found", v.name, kind, ps.pod.Namespace, name)
		}
		missing := kind + " " + name
		if optional {
			missing = ""
		}
		files, err := volumeFiles(data, items, mode, missing)
		if err != nil {
			return fmt.Errorf("volume %s: %w", v.name, err)
		}
		byMode := map[int32][]string{}
		for _, f := range files {
			full := path.Join(dir, f.path)
			if err := p.sb.WriteFile(ctx, id, full, bytes.NewReader(f.data)); err != nil {
				return fmt.Errorf("volume %s: write %s: %w", v.name, full, err)
			}
			byMode[f.mode] = append(byMode[f.mode], full)
		}
		for m, paths := range byMode {
			var out strings.Builder
			args := append([]string{strconv.FormatInt(int64(m), 8)}, paths...)
			code, err := p.sb.Exec(ctx, id, client.ExecRequest{Cmd: "chmod", Args: args, User: "root", Stdout: &out, Stderr: &out})
			if err == nil && code != 0 {
				err = fmt.Errorf("chmod exited with %d: %s", code, strings.TrimSpace(out.String()))
			}
			if err != nil {
				return fmt.Errorf("volume %s: %w", v.name, err)
			}
		}
	}
	return nil
}

// volumeFile is one file of a configMap or secret volume.
type volumeFile struct {
	path string
	data []byte
	mode int32
}

// volumeFiles are the files of an object's data: the items named (each
// at its path, with its mode or the default), or every key. missing, when
// set, names the object, and a key an item names that it lacks is an
// error; unset (optional), such an item is skipped. Paths are relative
// and stay inside the volume.
func volumeFiles(data map[string][]byte, items []corev1.KeyToPath, defaultMode *int32, missing string) ([]volumeFile, error) {
	mode := int32(0o644)
	if defaultMode != nil {
		mode = *defaultMode & 0o777
	}
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
				return nil, fmt.Errorf("%s has no key %q", missing, it.Key)
			}
			continue
		}
		if path.IsAbs(it.Path) || it.Path != path.Clean(it.Path) || it.Path == ".." || strings.HasPrefix(it.Path, "../") {
			return nil, fmt.Errorf("item path %q: want a relative path inside the volume", it.Path)
		}
		m := mode
		if it.Mode != nil {
			m = *it.Mode & 0o777
		}
		out = append(out, volumeFile{path: it.Path, data: v, mode: m})
	}
	return out, nil
}
