package node

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/errdefs"
)

func volumePod() *corev1.Pod {
	pod := testPod()
	pod.Spec.Volumes = []corev1.Volume{
		{Name: "work", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
		{Name: "cache", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory}}},
		{Name: "kube-api-access-x", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
			{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token"}},
			{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "kube-root-ca.crt"}}},
			{DownwardAPI: &corev1.DownwardAPIProjection{}},
		}}}},
	}
	pod.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{
		{Name: "work", MountPath: "/work/"}, {Name: "cache", MountPath: "/cache/pip", SubPath: "pip"},
		{Name: "kube-api-access-x", MountPath: "/var/run/secrets/kubernetes.io/serviceaccount", ReadOnly: true},
	}
	pod.Spec.Containers = append(pod.Spec.Containers, corev1.Container{Name: "side", Image: pod.Spec.Containers[0].Image,
		VolumeMounts: []corev1.VolumeMount{{Name: "work", MountPath: "/srv/shared"}}})
	return pod
}

// TestPlanVolumes: mounts are planned in container order (paths cleaned,
// subPaths kept); the service account token volume is a file volume of
// its three sources; other volume types and projected sources, read-only
// emptyDir mounts, subPathExpr, subPaths and files leaving the volume,
// and downward fields the node does not resolve are refused naming the
// field.
func TestPlanVolumes(t *testing.T) {
	p, err := planPod(volumePod(), "n")
	if err != nil {
		t.Fatal(err)
	}
	want := []volumeMount{{"work", "/work", ""}, {"cache", "/cache/pip", "pip"}, {"kube-api-access-x", "/var/run/secrets/kubernetes.io/serviceaccount", ""}, {"work", "/srv/shared", ""}}
	if !reflect.DeepEqual(p.volumes, want) {
		t.Errorf("volumes = %+v, want %+v", p.volumes, want)
	}
	if len(p.files) != 1 || p.files[0].name != "kube-api-access-x" || len(p.files[0].sources) != 3 ||
		p.files[0].sources[0].kind != "token" || p.files[0].sources[1].kind != "configmap" || p.files[0].sources[2].kind != "downward" {
		t.Errorf("file volumes = %+v, want the token volume's three sources", p.files)
	}
	for _, tc := range []struct {
		name  string
		edit  func(*corev1.Pod)
		field string
	}{
		{"hostPath", func(p *corev1.Pod) {
			p.Spec.Volumes[0].VolumeSource = corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}}
		}, "spec.volumes[0]"},
		{"claim", func(p *corev1.Pod) {
			p.Spec.Volumes[1].VolumeSource = corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "c"}}
		}, "spec.volumes[1]"},
		{"projected trust bundle", func(p *corev1.Pod) {
			p.Spec.Volumes[2].Projected.Sources = append(p.Spec.Volumes[2].Projected.Sources, corev1.VolumeProjection{ClusterTrustBundle: &corev1.ClusterTrustBundleProjection{Path: "b"}})
		}, "spec.volumes[2].projected.sources[3]"},
		{"projected item out", func(p *corev1.Pod) {
			p.Spec.Volumes[2].Projected.Sources[1].ConfigMap.Items = []corev1.KeyToPath{{Key: "ca.crt", Path: "../ca.crt"}}
		}, "spec.volumes[2].projected.sources[1].configMap.items[0].path"},
		{"token path", func(p *corev1.Pod) { p.Spec.Volumes[2].Projected.Sources[0].ServiceAccountToken.Path = "/token" },
			"spec.volumes[2].projected.sources[0].serviceAccountToken.path"},
		{"secret item out", func(p *corev1.Pod) {
			p.Spec.Volumes[0].VolumeSource = corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "s", Items: []corev1.KeyToPath{{Key: "k", Path: "a/../../k"}}}}
		}, "spec.volumes[0].secret.items[0].path"},
		{"downward field", func(p *corev1.Pod) {
			p.Spec.Volumes[0].VolumeSource = corev1.VolumeSource{DownwardAPI: &corev1.DownwardAPIVolumeSource{Items: []corev1.DownwardAPIVolumeFile{
				{Path: "name", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}},
				{Path: "ip", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}}}}}
		}, "spec.volumes[0].downwardAPI.items[1].fieldRef.fieldPath"},
		{"downward container", func(p *corev1.Pod) {
			p.Spec.Volumes[2].Projected.Sources[2].DownwardAPI.Items = []corev1.DownwardAPIVolumeFile{
				{Path: "mem", ResourceFieldRef: &corev1.ResourceFieldSelector{ContainerName: "nope", Resource: "limits.memory"}}}
		}, "spec.volumes[2].projected.sources[2].downwardAPI.items[0].resourceFieldRef.containerName"},
		{"readOnly", func(p *corev1.Pod) { p.Spec.Containers[1].VolumeMounts[0].ReadOnly = true }, "spec.containers[1].volumeMounts[0].readOnly"},
		{"subPathExpr", func(p *corev1.Pod) { p.Spec.Containers[0].VolumeMounts[0].SubPathExpr = "$(POD)" }, "spec.containers[0].volumeMounts[0].subPathExpr"},
		{"subPath out", func(p *corev1.Pod) { p.Spec.Containers[0].VolumeMounts[1].SubPath = "../etc" }, "spec.containers[0].volumeMounts[1].subPath"},
		{"root", func(p *corev1.Pod) { p.Spec.Containers[0].VolumeMounts[0].MountPath = "/" }, "spec.containers[0].volumeMounts[0].mountPath"},
		{"unknown volume", func(p *corev1.Pod) { p.Spec.Containers[0].VolumeMounts[0].Name = "nope" }, "spec.containers[0].volumeMounts[0].name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := volumePod()
			tc.edit(pod)
			_, err := planPod(pod, "n")
			var pe *planError
			if !errors.As(err, &pe) || pe.field != tc.field {
				t.Errorf("planPod = %v, want a plan error on %s", err, tc.field)
			}
		})
	}
}

// fakeVolumes records what makeVolumes asks of the daemon; links holds
// the symbolic links there are.
type fakeVolumes struct {
	dirs, calls []string
	links       map[string]string
}

func (f *fakeVolumes) MakeDir(_ context.Context, _, p string) error {
	f.dirs = append(f.dirs, p)
	return nil
}

func (f *fakeVolumes) Stat(_ context.Context, _, p string) (client.EntryInfo, error) {
	if t, ok := f.links[p]; ok {
		return client.EntryInfo{Path: p, Type: "symlink", SymlinkTarget: t}, nil
	}
	return client.EntryInfo{}, fmt.Errorf("%s: %w", p, errdefs.ErrNotFound)
}

func (f *fakeVolumes) Exec(_ context.Context, _ string, req client.ExecRequest) (int, error) {
	f.calls = append(f.calls, req.Cmd+" "+strings.Join(req.Args, " "))
	f.links[req.Args[2]] = req.Args[1]
	return 0, nil
}

// TestMakeVolumes: a volume's directory is where it is first mounted
// whole, under the pod's directory when only parts are mounted; other
// mounts are links to it (or to the part, made); made again, the links
// there are kept.
func TestMakeVolumes(t *testing.T) {
	mounts := []volumeMount{{"work", "/work", ""}, {"cache", "/cache/pip", "pip"}, {"work", "/srv/shared", ""}, {"work", "/data/in", "in"}}
	f := &fakeVolumes{links: map[string]string{}}
	home, err := makeVolumes(t.Context(), f, "sb1", mounts)
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]string{"work": "/work", "cache": podDir + "/volumes/cache"}; !reflect.DeepEqual(home, want) {
		t.Errorf("volume directories = %v, want %v", home, want)
	}
	wantLinks := map[string]string{"/cache/pip": podDir + "/volumes/cache/pip", "/srv/shared": "/work", "/data/in": "/work/in"}
	if !reflect.DeepEqual(f.links, wantLinks) {
		t.Errorf("links = %v, want %v", f.links, wantLinks)
	}
	for _, d := range []string{"/work", podDir + "/volumes/cache/pip", "/work/in", "/srv", "/data"} {
		if !strings.Contains(" "+strings.Join(f.dirs, " ")+" ", " "+d+" ") {
			t.Errorf("directories made = %v, want %s among them", f.dirs, d)
		}
	}
	f.calls = nil
	if _, err := makeVolumes(t.Context(), f, "sb1", mounts); err != nil || len(f.calls) != 0 {
		t.Errorf("made again: %v, calls %v; want the links kept", err, f.calls)
	}
	// A path of the template where a link should go fails.
	f.links = map[string]string{"/srv/shared": "/elsewhere"}
	if _, err := makeVolumes(t.Context(), f, "sb1", mounts); err == nil || !strings.Contains(err.Error(), "/srv/shared is taken") {
		t.Errorf("a taken mount path = %v, want an error naming it", err)
	}
}

// TestVolumeFiles: every key at its own name with the default mode, or
// the items named at their paths with their modes; a missing key fails
// unless the volume is optional. (A path out of the volume is refused at
// plan: TestPlanVolumes.)
func TestVolumeFiles(t *testing.T) {
	data := map[string][]byte{"b.conf": []byte("b"), "a.conf": []byte("a")}
	all, err := volumeFiles(data, nil, nil, "configmap c")
	if want := []volumeFile{{"a.conf", []byte("a"), 0o644}, {"b.conf", []byte("b"), 0o644}}; err != nil || !reflect.DeepEqual(all, want) {
		t.Errorf("all keys = %+v, %v; want %+v", all, err, want)
	}
	m400, m600 := int32(0o400), int32(0o600)
	items := []corev1.KeyToPath{{Key: "a.conf", Path: "conf/a"}, {Key: "b.conf", Path: "b", Mode: &m600}}
	got, err := volumeFiles(data, items, &m400, "secret s")
	if want := []volumeFile{{"conf/a", []byte("a"), 0o400}, {"b", []byte("b"), 0o600}}; err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("items = %+v, %v; want %+v", got, err, want)
	}
	missing := append(items, corev1.KeyToPath{Key: "c.conf", Path: "c"})
	if _, err := volumeFiles(data, missing, nil, "secret s"); err == nil || !strings.Contains(err.Error(), `secret s has no key "c.conf"`) {
		t.Errorf("missing key = %v", err)
	}
	if got, err := volumeFiles(data, missing, nil, ""); err != nil || len(got) != 2 {
		t.Errorf("missing key, optional = %+v, %v; want it skipped", got, err)
	}
}
