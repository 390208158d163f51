package node

import (
	"context"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// The downward API on a Berth node: a downwardAPI volume's (or a projected
// volume's downwardAPI source's) files hold fields of the pod, and an env
// variable's resourceFieldRef a container's resources, as on a kubelet.
//
// A file's fieldRef names the pod's name, namespace, uid, its labels or
// annotations (all of them: one `key="value"` line each, sorted by key,
// the value quoted as Go quotes strings, no newline after the last), or
// one label's or annotation's value. The files follow the pod: the
// volume sync (filevolumes.go) rewrites a file whose field changed.
//
// A resourceFieldRef names one container's limit or request of cpu,
// memory or ephemeral-storage, divided by its divisor (1 unless set) and
// rounded up: 250m of CPU reads 1 with the default divisor and 250 with
// 1m. A limit the container does not set is what it can use on the node:
// the sandbox's (all the pod's containers share it), where a kubelet would
// give the node's allocatable. A request it does not set is 0.

// downwardFieldPaths are the pod fields a downwardAPI file may name (a
// label or annotation by key too: fieldLabel).
var downwardFieldPaths = map[string]bool{
	"metadata.name": true, "metadata.namespace": true, "metadata.uid": true,
	"metadata.labels": true, "metadata.annotations": true,
}

// resourceFields are the resources a resourceFieldRef may name.
var resourceFields = map[string]bool{
	"limits.cpu": true, "limits.memory": true, "limits.ephemeral-storage": true,
	"requests.cpu": true, "requests.memory": true, "requests.ephemeral-storage": true,
}

// checkDownwardFiles refuses at plan the downwardAPI files the node cannot
// write: a path outside the volume, a field it does not resolve, a
// resource of a container the pod does not have.
func checkDownwardFiles(field string, items []corev1.DownwardAPIVolumeFile, containers map[string]bool) error {
	for k, it := range items {
		f := fmt.Sprintf("%s[%d]", field, k)
		if err := checkItemPath(f+".path", it.Path); err != nil {
			return err
		}
		switch {
		case it.FieldRef != nil && it.ResourceFieldRef != nil, it.FieldRef == nil && it.ResourceFieldRef == nil:
			return &planError{f, "want one of fieldRef and resourceFieldRef"}
		case it.FieldRef != nil:
			if p := it.FieldRef.FieldPath; !downwardFieldPaths[p] && !fieldLabel.MatchString(p) {
				return &planError{f + ".fieldRef.fieldPath", fmt.Sprintf("%q is not a field a downwardAPI volume holds", p)}
			}
		default:
			if err := checkResourceRef(f+".resourceFieldRef", it.ResourceFieldRef, containers, ""); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkResourceRef refuses a resourceFieldRef the node cannot resolve;
// self is the container an env variable's ref defaults to ("" for a
// volume's, which must name one).
func checkResourceRef(field string, r *corev1.ResourceFieldSelector, containers map[string]bool, self string) error {
	if !resourceFields[r.Resource] {
		return &planError{field + ".resource", fmt.Sprintf("%q: want limits or requests of cpu, memory or ephemeral-storage", r.Resource)}
	}
	name := r.ContainerName
	if name == "" {
		name = self
	}
	if !containers[name] {
		return &planError{field + ".containerName", fmt.Sprintf("%q is no container of the pod", r.ContainerName)}
	}
	if r.Divisor.Sign() < 0 {
		return &planError{field + ".divisor", "must not be negative"}
	}
	return nil
}

// podFile is the content of a downwardAPI file's fieldRef.
func podFile(pod *corev1.Pod, fieldPath string) string {
	switch fieldPath {
	case "metadata.labels":
		return formatMap(pod.Labels)
	case "metadata.annotations":
		return formatMap(pod.Annotations)
	}
	return podField(pod, fieldPath, "", "", "")
}

// formatMap renders labels or annotations as a downwardAPI file holds
// them.
func formatMap(m map[string]string) string {
	lines := make([]string, 0, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		lines = append(lines, k+"="+strconv.Quote(m[k]))
	}
	return strings.Join(lines, "\n")
}

// sandboxSize is what a pod's sandbox has: a container's limit where it
// sets none.
type sandboxSize struct {
	cpuMilli, memBytes, diskBytes int64
}

// sizeOf reads sandbox id's size from the daemon.
func (p *Pods) sizeOf(ctx context.Context, id string) (sandboxSize, error) {
	sb, err := p.sb.Get(ctx, id)
	if err != nil {
		return sandboxSize{}, fmt.Errorf("sandbox size: %w", err)
	}
	return sandboxSize{cpuMilli: int64(math.Round(sb.CPU * 1000)), memBytes: sb.MemoryBytes, diskBytes: sb.DiskBytes}, nil
}

// resourceValue is a resourceFieldRef's value for the pod's container
// (the ref's, or self when it names none).
// size is asked for only when the limit falls back to the sandbox's.
func resourceValue(pod *corev1.Pod, r *corev1.ResourceFieldSelector, self string, size func() (sandboxSize, error)) (string, error) {
	name := r.ContainerName
	if name == "" {
		name = self
	}
	i := slices.IndexFunc(pod.Spec.Containers, func(c corev1.Container) bool { return c.Name == name })
	var c corev1.Container
	switch {
	case i >= 0:
		c = pod.Spec.Containers[i]
	default:
		j := slices.IndexFunc(pod.Spec.InitContainers, func(c corev1.Container) bool { return c.Name == name })
		if j < 0 {
			return "", fmt.Errorf("resourceFieldRef: no container %q", name)
		}
		c = pod.Spec.InitContainers[j]
	}
	kind, res, _ := strings.Cut(r.Resource, ".")
	list := c.Resources.Requests
	if kind == "limits" {
		list = c.Resources.Limits
	}
	q, set := list[corev1.ResourceName(res)]
	if !set && kind == "limits" {
		size, err := size()
		if err != nil {
			return "", err
		}
		switch res {
		case "cpu":
			q = *resource.NewMilliQuantity(size.cpuMilli, resource.DecimalSI)
		case "memory":
			q = *resource.NewQuantity(size.memBytes, resource.BinarySI)
		default:
			q = *resource.NewQuantity(size.diskBytes, resource.BinarySI)
		}
	}
	div := r.Divisor
	if div.IsZero() {
		div = resource.MustParse("1")
	}
	if res == "cpu" {
		return strconv.FormatInt(int64(math.Ceil(float64(q.MilliValue())/float64(div.MilliValue()))), 10), nil
	}
	return strconv.FormatInt(int64(math.Ceil(float64(q.Value())/float64(div.Value()))), 10), nil
}

// downwardFiles are the files of a downwardAPI source for the pod, whose
// sandbox has size.
func downwardFiles(pod *corev1.Pod, items []corev1.DownwardAPIVolumeFile, defaultMode *int32, size func() (sandboxSize, error)) ([]volumeFile, error) {
	mode := fileMode(defaultMode, nil)
	out := make([]volumeFile, 0, len(items))
	for _, it := range items {
		var v string
		if it.FieldRef != nil {
			v = podFile(pod, it.FieldRef.FieldPath)
		} else {
			var err error
			if v, err = resourceValue(pod, it.ResourceFieldRef, "", size); err != nil {
				return nil, err
			}
		}
		out = append(out, volumeFile{path: it.Path, data: []byte(v), mode: fileMode(&mode, it.Mode)})
	}
	return out, nil
}

// sizeOnce is a size func that reads sandbox id's size at most once.
func (p *Pods) sizeOnce(ctx context.Context, id string) func() (sandboxSize, error) {
	var size *sandboxSize
	return func() (sandboxSize, error) {
		if size == nil {
			s, err := p.sizeOf(ctx, id)
			if err != nil {
				return s, err
			}
			size = &s
		}
		return *size, nil
	}
}

// fileMode is a file's mode: its own (item), else the volume's default,
// else 0644.
func fileMode(defaultMode, item *int32) int32 {
	switch {
	case item != nil:
		return *item & 0o777
	case defaultMode != nil:
		return *defaultMode & 0o777
	}
	return 0o644
}
