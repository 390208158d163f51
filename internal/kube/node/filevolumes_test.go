package node

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

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
	f := newFileRunner()
	p := &Pods{ctx: ctx, sb: f, kube: kube, log: slog.New(slog.DiscardHandler)}
	pl, err := planPod(pod, "node")
	if err != nil {
		t.Fatal(err)
	}
	ps := &podState{pod: pod, plan: pl, ctx: ctx, sandboxID: "sb"}
	if err := p.fillVolumes(ctx, ps, "sb", volumeHomes(pl.volumes)); err != nil {
		t.Fatal(err)
	}
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
