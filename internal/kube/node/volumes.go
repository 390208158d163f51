package node

import (
	"context"
	"errors"
	"fmt"
	"path"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/errdefs"
)

// A pod's containers share one sandbox, and so one filesystem: an
// emptyDir volume is a directory of it. The first place the volume is
// mounted (whole) is the directory; every other mount of it, a subPath of
// it, or a mount in a second container at another path, is a symbolic
// link to the directory (or the subPath in it, made when missing). So the
// containers see one volume's files wherever they mount it, as on a
// kubelet. The volume lives as long as the sandbox and is counted in its
// disk; medium Memory is that same disk, and sizeLimit is not enforced
// apart from the sandbox's disk limit (docs/kubernetes.md). A read-only
// mount is refused: nothing would enforce it.
//
// configMap, secret, downwardAPI and projected volumes (the service
// account token volume the ServiceAccount admission plugin adds to every
// pod among them) are directories the node fills with files
// (filevolumes.go). Every other volume type is refused naming it.

// volumeMount is one mount of an emptyDir volume: at path, of sub (a
// relative path in the volume, "" for all of it).
type volumeMount struct {
	volume, path, sub string
}

// fileVolume is a volume of files the node writes before the containers
// start and keeps up to date: a configMap, secret or downwardAPI volume
// (one source) or a projected one (its sources' files in one directory).
type fileVolume struct {
	name    string
	sources []fileSource
}

// fileSource is where some of a file volume's files come from.
type fileSource struct {
	// kind is "configmap" or "secret" (object's keys), "downward" (the
	// pod's fields, fields) or "token" (a service account token, token).
	kind, object string
	items        []corev1.KeyToPath
	// defaultMode is the volume's; optional the object's.
	defaultMode *int32
	optional    bool
	fields      []corev1.DownwardAPIVolumeFile
	token       *corev1.ServiceAccountTokenProjection
}

// planVolumes reads the pod's volumes and its containers' mounts of them.
func planVolumes(spec *corev1.PodSpec) ([]volumeMount, []fileVolume, error) {
	empty := map[string]bool{}
	filled := map[string]bool{}
	var files []fileVolume
	containers := containerNames(*spec)
	for i, v := range spec.Volumes {
		field := fmt.Sprintf("spec.volumes[%d]", i)
		var sources []fileSource
		switch {
		case v.EmptyDir != nil:
			empty[v.Name] = true
			continue
		case v.ConfigMap != nil:
			cm := v.ConfigMap.DeepCopy()
			if err := checkItems(field+".configMap.items", cm.Items); err != nil {
				return nil, nil, err
			}
			sources = []fileSource{{kind: "configmap", object: cm.Name, items: cm.Items, defaultMode: cm.DefaultMode, optional: ptr.Deref(cm.Optional, false)}}
		case v.Secret != nil:
			sc := v.Secret.DeepCopy()
			if err := checkItems(field+".secret.items", sc.Items); err != nil {
				return nil, nil, err
			}
			sources = []fileSource{{kind: "secret", object: sc.SecretName, items: sc.Items, defaultMode: sc.DefaultMode, optional: ptr.Deref(sc.Optional, false)}}
		case v.DownwardAPI != nil:
			d := v.DownwardAPI.DeepCopy()
			if err := checkDownwardFiles(field+".downwardAPI.items", d.Items, containers); err != nil {
				return nil, nil, err
			}
			sources = []fileSource{{kind: "downward", fields: d.Items, defaultMode: d.DefaultMode}}
		case v.Projected != nil:
			pv := v.Projected.DeepCopy()
			for j, src := range pv.Sources {
				sfield := fmt.Sprintf("%s.projected.sources[%d]", field, j)
				fs := fileSource{defaultMode: pv.DefaultMode}
				switch {
				case src.ConfigMap != nil:
					if err := checkItems(sfield+".configMap.items", src.ConfigMap.Items); err != nil {
						return nil, nil, err
					}
					fs.kind, fs.object, fs.items, fs.optional = "configmap", src.ConfigMap.Name, src.ConfigMap.Items, ptr.Deref(src.ConfigMap.Optional, false)
				case src.Secret != nil:
					if err := checkItems(sfield+".secret.items", src.Secret.Items); err != nil {
						return nil, nil, err
					}
					fs.kind, fs.object, fs.items, fs.optional = "secret", src.Secret.Name, src.Secret.Items, ptr.Deref(src.Secret.Optional, false)
				case src.DownwardAPI != nil:
					if err := checkDownwardFiles(sfield+".downwardAPI.items", src.DownwardAPI.Items, containers); err != nil {
						return nil, nil, err
					}
					fs.kind, fs.fields = "downward", src.DownwardAPI.Items
				case src.ServiceAccountToken != nil:
					if err := checkItemPath(sfield+".serviceAccountToken.path", src.ServiceAccountToken.Path); err != nil {
						return nil, nil, err
					}
					fs.kind, fs.token = "token", src.ServiceAccountToken
				default:
					return nil, nil, &planError{sfield, fmt.Sprintf("volume %q: a projected volume's sources may be configMap, secret, downwardAPI and serviceAccountToken on Berth nodes", v.Name)}
				}
				sources = append(sources, fs)
			}
		default:
			return nil, nil, &planError{field, fmt.Sprintf("volume %q: only emptyDir, configMap, secret, downwardAPI and projected volumes are supported on Berth nodes (the sandbox's disk holds them)", v.Name)}
		}
		empty[v.Name], filled[v.Name] = true, true
		files = append(files, fileVolume{name: v.Name, sources: sources})
	}
	var mounts []volumeMount
	type group struct {
		field string
		cs    []corev1.Container
	}
	for _, g := range []group{{"spec.initContainers", spec.InitContainers}, {"spec.containers", spec.Containers}} {
		for i, c := range g.cs {
			ms, err := planMounts(fmt.Sprintf("%s[%d]", g.field, i), c, empty, filled)
			if err != nil {
				return nil, nil, err
			}
			mounts = append(mounts, ms...)
		}
	}
	return mounts, files, nil
}

// planMounts reads one container's mounts of the pod's volumes.
func planMounts(cfield string, c corev1.Container, empty, filled map[string]bool) ([]volumeMount, error) {
	var mounts []volumeMount
	for j, m := range c.VolumeMounts {
		field := fmt.Sprintf("%s.volumeMounts[%d]", cfield, j)
		switch {
		case !empty[m.Name]:
			return nil, &planError{field + ".name", fmt.Sprintf("no volume %q in spec.volumes", m.Name)}
		case m.ReadOnly && !filled[m.Name]:
			return nil, &planError{field + ".readOnly", "read-only emptyDir mounts are not supported on Berth nodes (a volume is a directory of the sandbox)"}
		case m.SubPathExpr != "":
			return nil, &planError{field + ".subPathExpr", "subPathExpr is not supported on Berth nodes"}
		case !path.IsAbs(m.MountPath) || path.Clean(m.MountPath) == "/":
			return nil, &planError{field + ".mountPath", fmt.Sprintf("%q: want an absolute path other than /", m.MountPath)}
		}
		sub := m.SubPath
		if sub != "" && (path.IsAbs(sub) || sub != path.Clean(sub) || sub == ".." || strings.HasPrefix(sub, "../")) {
			return nil, &planError{field + ".subPath", fmt.Sprintf("%q: want a relative path inside the volume", sub)}
		}
		mounts = append(mounts, volumeMount{volume: m.Name, path: path.Clean(m.MountPath), sub: sub})
	}
	return mounts, nil
}

// checkItems refuses items whose path is not one inside the volume.
func checkItems(field string, items []corev1.KeyToPath) error {
	for k, it := range items {
		if err := checkItemPath(fmt.Sprintf("%s[%d].path", field, k), it.Path); err != nil {
			return err
		}
	}
	return nil
}

// checkItemPath refuses a file's path that is not relative or leaves its
// volume.
func checkItemPath(field, p string) error {
	if p == "" || path.IsAbs(p) || p != path.Clean(p) || p == ".." || strings.HasPrefix(p, "../") {
		return &planError{field, fmt.Sprintf("%q: want a relative path inside the volume", p)}
	}
	return nil
}

// volumeHomes is each mounted volume's directory in the sandbox: where it
// is first mounted whole, else (mounted in parts only) under the pod's
// directory.
func volumeHomes(mounts []volumeMount) map[string]string {
	home := map[string]string{}
	for _, m := range mounts {
		if _, ok := home[m.volume]; !ok && m.sub == "" {
			home[m.volume] = m.path
		}
	}
	for _, m := range mounts {
		if _, ok := home[m.volume]; !ok {
			home[m.volume] = path.Join(podDir, "volumes", m.volume)
		}
	}
	return home
}

// volumeRunner is what making the volumes takes of the daemon.
type volumeRunner interface {
	MakeDir(ctx context.Context, id, path string) error
	Stat(ctx context.Context, id, path string) (client.EntryInfo, error)
	Exec(ctx context.Context, id string, req client.ExecRequest) (int, error)
}

// makeVolumes makes the pod's emptyDir volumes in sandbox id: each
// volume's directory where it is first mounted whole (or, when it is
// only ever mounted in parts, where its first part is, as the parent of
// the parts), the parts it is mounted by, and links at every other mount
// path. A link's path taken by a file of the template fails the pod: a
// kubelet would hide it under the mount, a link cannot. Made again (a
// sandbox from a snapshot, a node that restarted), what is there is kept.
func makeVolumes(ctx context.Context, sb volumeRunner, id string, mounts []volumeMount) (map[string]string, error) {
	home := volumeHomes(mounts)
	made := map[string]bool{}
	mkdir := func(p string) error {
		if made[p] {
			return nil
		}
		if err := sb.MakeDir(ctx, id, p); err != nil && !errors.Is(err, errdefs.ErrAlreadyExists) {
			return fmt.Errorf("make %s: %w", p, err)
		}
		made[p] = true
		return nil
	}
	for _, m := range mounts {
		dir := home[m.volume]
		if err := mkdir(dir); err != nil {
			return nil, fmt.Errorf("volume %s: %w", m.volume, err)
		}
		target := path.Join(dir, m.sub)
		if err := mkdir(target); err != nil {
			return nil, fmt.Errorf("volume %s: %w", m.volume, err)
		}
		if m.path == target {
			continue
		}
		if err := mkdir(path.Dir(m.path)); err != nil {
			return nil, fmt.Errorf("volume %s: %w", m.volume, err)
		}
		switch st, err := sb.Stat(ctx, id, m.path); {
		case err == nil && st.SymlinkTarget == target:
			continue // made before: a sandbox from a snapshot, or a node that restarted
		case err == nil:
			return nil, fmt.Errorf("volume %s: mount path %s is taken in the sandbox (a %s of its template)", m.volume, m.path, st.Type)
		case !errors.Is(err, errdefs.ErrNotFound):
			return nil, fmt.Errorf("volume %s: %w", m.volume, err)
		}
		var out strings.Builder
		code, err := sb.Exec(ctx, id, client.ExecRequest{Cmd: "ln", Args: []string{"-s", target, m.path}, Stdout: &out, Stderr: &out})
		if err == nil && code != 0 {
			err = fmt.Errorf("ln exited with %d: %s", code, strings.TrimSpace(out.String()))
		}
		if err != nil {
			return nil, fmt.Errorf("volume %s at %s: link to %s: %w", m.volume, m.path, target, err)
		}
	}
	return home, nil
}
