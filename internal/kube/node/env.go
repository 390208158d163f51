package node

import (
	"context"
	"fmt"
	"maps"
	"regexp"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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

// envRef is one env entry whose value comes from elsewhere.
type envRef struct {
	name string
	src  *corev1.EnvVarSource
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

// containerEnv is the environment container c starts with.
func (p *Pods) containerEnv(ctx context.Context, ps *podState, c containerPlan) (map[string]string, error) {
	if len(c.envFrom) == 0 && len(c.refs) == 0 {
		return c.env, nil
	}
	if p.kube == nil {
		return nil, fmt.Errorf("environment from ConfigMaps, Secrets or fields: the node has no API client")
	}
	p.mu.Lock()
	pod := ps.pod.DeepCopy()
	podIP := ps.podIP
	p.mu.Unlock()
	ns := pod.Namespace
	cms := map[string]*corev1.ConfigMap{}
	secrets := map[string]*corev1.Secret{}
	configMap := func(name string) (*corev1.ConfigMap, error) {
		return readOnce(ctx, cms, "configmap", ns, name, p.kube.CoreV1().ConfigMaps(ns).Get)
	}
	secret := func(name string) (*corev1.Secret, error) {
		return readOnce(ctx, secrets, "secret", ns, name, p.kube.CoreV1().Secrets(ns).Get)
	}
	optional := func(b *bool) bool { return b != nil && *b }
	env := map[string]string{}
	for _, ef := range c.envFrom {
		switch {
		case ef.ConfigMapRef != nil:
			cm, err := configMap(ef.ConfigMapRef.Name)
			if err != nil {
				return nil, err
			}
			if cm == nil {
				if optional(ef.ConfigMapRef.Optional) {
					continue
				}
				return nil, fmt.Errorf("envFrom: configmap %q not found in namespace %s", ef.ConfigMapRef.Name, ns)
			}
			for k, v := range cm.Data {
				if envVarName.MatchString(ef.Prefix + k) {
					env[ef.Prefix+k] = v
				}
			}
		case ef.SecretRef != nil:
			s, err := secret(ef.SecretRef.Name)
			if err != nil {
				return nil, err
			}
			if s == nil {
				if optional(ef.SecretRef.Optional) {
					continue
				}
				return nil, fmt.Errorf("envFrom: secret %q not found in namespace %s", ef.SecretRef.Name, ns)
			}
			for k, v := range s.Data {
				if envVarName.MatchString(ef.Prefix + k) {
					env[ef.Prefix+k] = string(v)
				}
			}
		}
	}
	maps.Copy(env, c.env)
	for _, r := range c.refs {
		switch s := r.src; {
		case s.ConfigMapKeyRef != nil:
			ref := s.ConfigMapKeyRef
			cm, err := configMap(ref.Name)
			if err != nil {
				return nil, err
			}
			v, ok := "", false
			if cm != nil {
				v, ok = cm.Data[ref.Key]
			}
			switch {
			case ok:
				env[r.name] = v
			case !optional(ref.Optional):
				return nil, fmt.Errorf("env %s: key %q of configmap %q not found in namespace %s", r.name, ref.Key, ref.Name, ns)
			}
		case s.SecretKeyRef != nil:
			ref := s.SecretKeyRef
			sec, err := secret(ref.Name)
			if err != nil {
				return nil, err
			}
			var v []byte
			ok := false
			if sec != nil {
				v, ok = sec.Data[ref.Key]
			}
			switch {
			case ok:
				env[r.name] = string(v)
			case !optional(ref.Optional):
				return nil, fmt.Errorf("env %s: key %q of secret %q not found in namespace %s", r.name, ref.Key, ref.Name, ns)
			}
		case s.FieldRef != nil:
			env[r.name] = podField(pod, s.FieldRef.FieldPath, p.node, p.ip, podIP)
		}
	}
	return env, nil
}

// readOnce reads object name of namespace ns once per container start
// (seen holds what was read); nil, nil is one that does not exist.
func readOnce[T any](ctx context.Context, seen map[string]*T, kind, ns, name string, get func(context.Context, string, metav1.GetOptions) (*T, error)) (*T, error) {
	if o, ok := seen[name]; ok {
		return o, nil
	}
	o, err := get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		o, err = nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%s %s/%s: %w", kind, ns, name, err)
	}
	seen[name] = o
	return o, nil
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
