package node

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/berth-sandbox/berth/client"
)

// fileRunner is fakeRunner's files with the writes and the commands the
// volume sync runs (chmod, mv -f, rm -f).
type fileRunner struct {
	*fakeRunner
	modes map[string]int64
	moved []string
}

func newFileRunner() *fileRunner {
	return &fileRunner{fakeRunner: newFakeRunner(), modes: map[string]int64{}}
}

func (f *fileRunner) WriteFile(_ context.Context, _, path string, r io.Reader) error {
	b, err := io.ReadAll(r)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.files[path] = string(b)
	return err
}

func (f *fileRunner) Exec(_ context.Context, _ string, req client.ExecRequest) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case req.Cmd == "chmod" && len(req.Args) >= 2:
		m, err := strconv.ParseInt(req.Args[0], 8, 32)
		if err != nil {
			return 1, nil
		}
		for _, p := range req.Args[1:] {
			f.modes[p] = m
		}
	case req.Cmd == "mv" && slices.Equal(req.Args[:1], []string{"-f"}) && len(req.Args) == 3:
		from, to := req.Args[1], req.Args[2]
		f.files[to], f.modes[to] = f.files[from], f.modes[from]
		delete(f.files, from)
		delete(f.modes, from)
		f.moved = append(f.moved, to)
	case req.Cmd == "rm" && len(req.Args) == 2 && req.Args[0] == "-f":
		delete(f.files, req.Args[1])
	default:
		return 127, nil
	}
	return 0, nil
}

func (f *fileRunner) snapshot() map[string]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return maps.Clone(f.files)
}

// TestVolumeSync: configMap and secret volumes follow their objects: a
// changed key is rewritten through a file moved into place, a removed key's
// file goes, a new key's comes; nothing changes when nothing did; a copy
// changed in the sandbox is put back; a required object that has gone
// leaves its files, an optional one's go.
func TestVolumeSync(t *testing.T) {
	ctx := t.Context()
	opt := true
	pod := testPod()
	pod.Spec.Volumes = []corev1.Volume{
		{Name: "cfg", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "settings"}}}},
		{Name: "tok", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "token", Optional: &opt}}},
	}
	pod.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "cfg", MountPath: "/etc/cfg"}, {Name: "tok", MountPath: "/run/tok"}}
	kube := fake.NewClientset(
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: "settings"}, Data: map[string]string{"a": "1", "b": "2"}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: "token"}, Data: map[string][]byte{"t": []byte("s1")}},
	)
	p, ps, f := filledPod(t, pod, kube)
	want := map[string]string{"/etc/cfg/a": "1", "/etc/cfg/b": "2", "/run/tok/t": "s1"}
	if got := f.snapshot(); !maps.Equal(got, want) {
		t.Fatalf("filled = %v, want %v", got, want)
	}
	sync := func(wantN int, wantErr bool) {
		t.Helper()
		n, err := p.syncVolumes(ctx, ps, "sb")
		var ce *configError
		if n != wantN || (err != nil) != wantErr || (err != nil && !errors.As(err, &ce)) {
			t.Errorf("sync = %d, %v; want %d changes, error %v", n, err, wantN, wantErr)
		}
	}

	sync(0, false)
	cms := kube.CoreV1().ConfigMaps(pod.Namespace)
	if _, err := cms.Update(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: "settings"}, Data: map[string]string{"a": "10", "c": "3"}}, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	sync(3, false)
	want = map[string]string{"/etc/cfg/a": "10", "/etc/cfg/c": "3", "/run/tok/t": "s1"}
	if got := f.snapshot(); !maps.Equal(got, want) {
		t.Errorf("after the update = %v, want %v", got, want)
	}
	if !slices.Equal(f.moved, []string{"/etc/cfg/a", "/etc/cfg/c"}) || f.modes["/etc/cfg/a"] != 0o644 {
		t.Errorf("moved into place %v (mode of a %o), want a and c at 0644", f.moved, f.modes["/etc/cfg/a"])
	}

	// A process changed its copy: put back.
	f.mu.Lock()
	f.files["/etc/cfg/a"] = "tampered"
	f.mu.Unlock()
	sync(1, false)
	if got := f.snapshot()["/etc/cfg/a"]; got != "10" {
		t.Errorf("a after the sync = %q, want 10", got)
	}

	// The required ConfigMap goes: its files stay, and the other volume
	// still follows its Secret. Then the optional Secret goes: its file
	// goes.
	if err := cms.Delete(ctx, "settings", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := kube.CoreV1().Secrets(pod.Namespace).Update(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: "token"}, Data: map[string][]byte{"t": []byte("s2")}}, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	sync(1, true)
	want = map[string]string{"/etc/cfg/a": "10", "/etc/cfg/c": "3", "/run/tok/t": "s2"}
	if got := f.snapshot(); !maps.Equal(got, want) {
		t.Errorf("after the ConfigMap's delete = %v, want %v", got, want)
	}
	if err := kube.CoreV1().Secrets(pod.Namespace).Delete(ctx, "token", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	sync(1, true)
	want = map[string]string{"/etc/cfg/a": "10", "/etc/cfg/c": "3"}
	if got := f.snapshot(); !maps.Equal(got, want) {
		t.Errorf("after the deletes = %v, want %v", got, want)
	}
}

// filledPod is a node's Pods over a fake sandbox "sb" (sizedRunner) and
// kube, and pod's state there once its file volumes were filled.
func filledPod(t *testing.T, pod *corev1.Pod, kube kubernetes.Interface) (*Pods, *podState, *fileRunner) {
	t.Helper()
	ctx := t.Context()
	f := newFileRunner()
	p := &Pods{ctx: ctx, sb: sizedRunner{f}, kube: kube, log: slog.New(slog.DiscardHandler)}
	pl, err := planPod(pod, "node")
	if err != nil {
		t.Fatal(err)
	}
	ps := &podState{pod: pod, plan: pl, ctx: ctx, sandboxID: "sb"}
	if err := p.fillVolumes(ctx, ps, "sb", volumeHomes(pl.volumes)); err != nil {
		t.Fatal(err)
	}
	return p, ps, f
}

// sizedRunner is a fileRunner whose sandbox has a size.
type sizedRunner struct{ *fileRunner }

func (sizedRunner) Get(_ context.Context, id string) (*client.Sandbox, error) {
	sb := &client.Sandbox{}
	sb.ID, sb.CPU, sb.MemoryBytes, sb.DiskBytes = id, 2, 1<<30, 4<<30
	return sb, nil
}

// TestProjectedVolumes: a projected volume holds its sources' files in
// one directory (a service account token bound to the pod, a ConfigMap's
// item, a downward field); a downwardAPI volume the pod's labels and one
// annotation, and its containers' resources (a limit the container does
// not set is the sandbox's). The sync rewrites the labels when they
// change and the token once it is due for a refresh, not before; a
// service account that does not exist holds the volume, naming it.
func TestProjectedVolumes(t *testing.T) {
	ctx := t.Context()
	pod := testPod()
	pod.Labels = map[string]string{"app": "agent", "tier": "b\"e"}
	pod.Annotations = map[string]string{"owner": "team-a"}
	pod.Spec.ServiceAccountName = "runner"
	exp := int64(600)
	m400 := int32(0o400)
	pod.Spec.Volumes = []corev1.Volume{
		{Name: "api", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{DefaultMode: &m400, Sources: []corev1.VolumeProjection{
			{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token", Audience: "vault", ExpirationSeconds: &exp}},
			{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "kube-root-ca.crt"}, Items: []corev1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}}}},
			{DownwardAPI: &corev1.DownwardAPIProjection{Items: []corev1.DownwardAPIVolumeFile{{Path: "namespace", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.namespace"}}}}},
		}}}},
		{Name: "info", VolumeSource: corev1.VolumeSource{DownwardAPI: &corev1.DownwardAPIVolumeSource{Items: []corev1.DownwardAPIVolumeFile{
			{Path: "labels", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.labels"}},
			{Path: "owner", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.annotations['owner']"}},
			{Path: "mem-mi", ResourceFieldRef: &corev1.ResourceFieldSelector{ContainerName: "main", Resource: "limits.memory", Divisor: resource.MustParse("1Mi")}},
			{Path: "cpu-m", ResourceFieldRef: &corev1.ResourceFieldSelector{ContainerName: "main", Resource: "limits.cpu", Divisor: resource.MustParse("1m")}},
			{Path: "cpu", ResourceFieldRef: &corev1.ResourceFieldSelector{ContainerName: "side", Resource: "limits.cpu"}},
			{Path: "side-mem", ResourceFieldRef: &corev1.ResourceFieldSelector{ContainerName: "side", Resource: "limits.memory"}},
			{Path: "side-req", ResourceFieldRef: &corev1.ResourceFieldSelector{ContainerName: "side", Resource: "requests.memory"}},
		}}}},
	}
	pod.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "api", MountPath: "/var/run/secrets/kubernetes.io/serviceaccount", ReadOnly: true}, {Name: "info", MountPath: "/etc/podinfo"}}
	pod.Spec.Containers = append(pod.Spec.Containers, corev1.Container{Name: "side", Image: pod.Spec.Containers[0].Image})
	kube := fake.NewClientset(&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: "kube-root-ca.crt"}, Data: map[string]string{"ca.crt": "PEM"}})
	var asked []*authenticationv1.TokenRequest
	var accounts []string
	kube.PrependReactor("create", "serviceaccounts", func(a k8stesting.Action) (bool, runtime.Object, error) {
		ca, ok := a.(k8stesting.CreateActionImpl)
		if !ok || a.GetSubresource() != "token" {
			return false, nil, nil
		}
		if ca.Name == "ghost" {
			return true, nil, apierrors.NewNotFound(corev1.Resource("serviceaccounts"), "ghost")
		}
		tr := ca.GetObject().(*authenticationv1.TokenRequest).DeepCopy()
		asked, accounts = append(asked, tr), append(accounts, ca.Name)
		tr.Status.Token = "tok-" + strconv.Itoa(len(asked))
		return true, tr, nil
	})
	p, ps, f := filledPod(t, pod, kube)
	pl := ps.plan
	sa := "/var/run/secrets/kubernetes.io/serviceaccount/"
	want := map[string]string{
		sa + "token": "tok-1", sa + "ca.crt": "PEM", sa + "namespace": "team",
		"/etc/podinfo/labels": "app=\"agent\"\ntier=\"b\\\"e\"", "/etc/podinfo/owner": "team-a",
		"/etc/podinfo/mem-mi": "256", "/etc/podinfo/cpu-m": "500", "/etc/podinfo/cpu": "2",
		"/etc/podinfo/side-mem": strconv.Itoa(1 << 30), "/etc/podinfo/side-req": "0",
	}
	if got := f.snapshot(); !maps.Equal(got, want) {
		t.Fatalf("filled = %v, want %v", got, want)
	}
	if f.modes[sa+"token"] != 0o400 || f.modes["/etc/podinfo/labels"] != 0o644 {
		t.Errorf("modes: token %o, labels %o; want 400 and 644", f.modes[sa+"token"], f.modes["/etc/podinfo/labels"])
	}
	if len(asked) != 1 || accounts[0] != "runner" || !slices.Equal(asked[0].Spec.Audiences, []string{"vault"}) || *asked[0].Spec.ExpirationSeconds != 600 ||
		asked[0].Spec.BoundObjectRef == nil || asked[0].Spec.BoundObjectRef.Kind != "Pod" || asked[0].Spec.BoundObjectRef.UID != pod.UID {
		t.Fatalf("token requests = %+v, want one for runner, audience vault, 600 s, bound to the pod", asked)
	}
	sync := func(wantN int) {
		t.Helper()
		if n, err := p.syncVolumes(ctx, ps, "sb"); n != wantN || err != nil {
			t.Errorf("sync = %d, %v; want %d changes", n, err, wantN)
		}
	}
	sync(0)
	if len(asked) != 1 {
		t.Errorf("a fresh token was asked for again (%d requests)", len(asked))
	}
	// New labels: the file follows.
	updated := pod.DeepCopy()
	updated.Labels["app"] = "agent-v2"
	p.mu.Lock()
	ps.pod = updated
	p.mu.Unlock()
	sync(1)
	if got := f.snapshot()["/etc/podinfo/labels"]; got != "app=\"agent-v2\"\ntier=\"b\\\"e\"" {
		t.Errorf("labels after the update = %q", got)
	}
	// The token is due (80 % of its life): a new one is written.
	k := tokenKey(pod.Spec.Volumes[0].Projected.Sources[0].ServiceAccountToken)
	p.mu.Lock()
	held := ps.tokens[k]
	p.mu.Unlock()
	if left := time.Until(held.refreshAt); left <= 0 || left > 480*time.Second {
		t.Errorf("token refreshed in %s, want within 80 %% of 600 s", left)
	}
	p.mu.Lock()
	held.refreshAt = time.Now().Add(-time.Second)
	ps.tokens[k] = held
	p.mu.Unlock()
	sync(1)
	if got := f.snapshot()[sa+"token"]; got != "tok-2" || len(asked) != 2 {
		t.Errorf("token after its refresh = %q (%d requests), want tok-2", got, len(asked))
	}
	// A service account that does not exist holds the volume.
	ghost := pod.DeepCopy()
	ghost.Spec.ServiceAccountName = "ghost"
	gs := &podState{pod: ghost, plan: pl, ctx: ctx, sandboxID: "sb2"}
	var ce *configError
	if err := p.fillVolumes(ctx, gs, "sb2", volumeHomes(pl.volumes)); !errors.As(err, &ce) || !strings.Contains(err.Error(), "service account team/ghost not found") {
		t.Errorf("fill with a missing service account = %v, want a config error naming it", err)
	}
}
