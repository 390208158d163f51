package node

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/berth-sandbox/berth/client"
)

// File volumes (configMap, secret, downwardAPI and projected ones) are
// directories of the sandbox holding copies of the objects' keys (and the
// pod's fields, downward.go, or a service account token, token.go),
// written as the sandbox's root: every key, or the items named, mode
// defaultMode (0644 unless set) or the item's (set with chmod). They are
// written before any container starts (a missing object or key that is
// not optional holds the start: awaitConfig) and, like a kubelet's
// mounts, kept up to date while the pod runs: every config sync period
// (a minute by default) the node reads the objects again and rewrites
// each file whose content differs from the sandbox's
// (a changed key, or a copy a process changed), each through a new file
// moved into place so a reader sees the old content or the new, never
// part of one; files of keys that are gone (or of an optional object that
// is gone) are removed. An object that is not optional and has gone
// leaves its files as they were, as a kubelet leaves a mount. A paused
// sandbox is left alone until it resumes. readOnly is taken but not
// enforced: a process running as the sandbox's root can change a copy
// until the next sync.

// DefaultConfigSyncPeriod is how often the node brings file volumes up to
// date (the kubelet's sync frequency).
const DefaultConfigSyncPeriod = time.Minute

// maxVolumeFile bounds one file read back from a sandbox to compare.
const maxVolumeFile = 4 << 20

// wantFiles are the files the pod's file volumes should hold, by path in
// the sandbox (id); kept are the volumes' directories whose object (not
// optional) has gone, left as they are.
func (p *Pods) wantFiles(ctx context.Context, ps *podState, id string, home map[string]string) (want map[string]volumeFile, kept []string, err error) {
	if p.kube == nil {
		return nil, nil, fmt.Errorf("configMap, secret, downwardAPI and projected volumes: the node has no API client")
	}
	p.mu.Lock()
	pod := ps.pod // replaced, never changed, on an update
	p.mu.Unlock()
	objs := &podObjects{kube: p.kube, ns: pod.Namespace}
	want = map[string]volumeFile{}
	// A volume whose object is missing is kept and named in err (the
	// first); the others are still read.
	var missingErr error
	keep := func(dir string, e *configError) {
		kept = append(kept, dir)
		if missingErr == nil {
			missingErr = e
		}
	}
	size := p.sizeOnce(ctx, id)
	for _, v := range ps.plan.files {
		dir, ok := home[v.name]
		if !ok {
			continue // mounted by no container
		}
		files, err := p.sourceFiles(ctx, ps, pod, objs, v, size)
		if ce, ok := err.(*configError); ok {
			keep(dir, &configError{fmt.Sprintf("volume %s: %s", v.name, ce.msg)})
			continue
		}
		if err != nil {
			return nil, nil, fmt.Errorf("volume %s: %w", v.name, err)
		}
		for _, f := range files {
			f.path = path.Join(dir, f.path)
			want[f.path] = f
		}
	}
	return want, kept, missingErr
}

// sourceFiles are the files of volume v, its sources' together; a
// configError names a missing object or key that is not optional, or two
// sources' files at one path.
func (p *Pods) sourceFiles(ctx context.Context, ps *podState, pod *corev1.Pod, objs *podObjects, v fileVolume, size func() (sandboxSize, error)) ([]volumeFile, error) {
	var out []volumeFile
	from := map[string]int{} // path: index of the source that wrote it
	for i, src := range v.sources {
		var files []volumeFile
		switch src.kind {
		case "configmap", "secret":
			data, found, err := objs.data(ctx, src.kind, src.object)
			switch {
			case err != nil:
				return nil, err
			case !found && src.optional:
				continue
			case !found:
				return nil, &configError{fmt.Sprintf("%s %s/%s not found", src.kind, pod.Namespace, src.object)}
			}
			missing := src.kind + " " + src.object
			if src.optional {
				missing = ""
			}
			if files, err = volumeFiles(data, src.items, src.defaultMode, missing); err != nil {
				return nil, err
			}
		case "downward":
			var err error
			if files, err = downwardFiles(pod, src.fields, src.defaultMode, size); err != nil {
				return nil, err
			}
		case "token":
			tok, err := p.serviceAccountToken(ctx, ps, pod, src.token)
			if err != nil {
				return nil, err
			}
			files = []volumeFile{{path: src.token.Path, data: []byte(tok), mode: fileMode(src.defaultMode, nil)}}
		}
		for _, f := range files {
			if j, ok := from[f.path]; ok {
				return nil, &configError{fmt.Sprintf("sources %d and %d both have a file %s", j, i, f.path)}
			}
			from[f.path] = i
			out = append(out, f)
		}
	}
	return out, nil
}

// fillVolumes writes the pod's file volumes into their directories
// (home, by volume) in sandbox id before its containers start, and
// records what it wrote for the syncs.
func (p *Pods) fillVolumes(ctx context.Context, ps *podState, id string, home map[string]string) error {
	if len(ps.plan.files) == 0 {
		return nil
	}
	want, _, err := p.wantFiles(ctx, ps, id, home)
	if err != nil {
		return err
	}
	paths := slices.Sorted(maps.Keys(want))
	byMode := map[int32][]string{}
	for _, full := range paths {
		f := want[full]
		if err := p.sb.WriteFile(ctx, id, full, bytes.NewReader(f.data)); err != nil {
			return fmt.Errorf("write %s: %w", full, err)
		}
		byMode[f.mode] = append(byMode[f.mode], full)
	}
	for m, paths := range byMode {
		if err := p.runIn(ctx, id, "chmod", append([]string{strconv.FormatInt(int64(m), 8)}, paths...)...); err != nil {
			return err
		}
	}
	p.mu.Lock()
	ps.volFiles = paths
	p.mu.Unlock()
	return nil
}

// syncVolumes brings the pod's file volumes in sandbox id to their
// sources' content now; it returns how many files it wrote or removed.
func (p *Pods) syncVolumes(ctx context.Context, ps *podState, id string) (int, error) {
	home := volumeHomes(ps.plan.volumes)
	want, kept, err := p.wantFiles(ctx, ps, id, home)
	if _, ok := err.(*configError); err != nil && !ok {
		return 0, err
	}
	p.mu.Lock()
	had := slices.Clone(ps.volFiles)
	p.mu.Unlock()
	changed := 0
	for _, full := range slices.Sorted(maps.Keys(want)) {
		f := want[full]
		var cur bytes.Buffer
		if rerr := p.sb.ReadFile(ctx, id, full, &limitWriter{w: &cur, n: maxVolumeFile}); rerr == nil && bytes.Equal(cur.Bytes(), f.data) {
			continue
		}
		// A new file next to it, moved into place.
		tmp := path.Join(path.Dir(full), ".berth-"+path.Base(full)+".new")
		if err := p.sb.WriteFile(ctx, id, tmp, bytes.NewReader(f.data)); err != nil {
			return changed, fmt.Errorf("write %s: %w", tmp, err)
		}
		if err := p.runIn(ctx, id, "chmod", strconv.FormatInt(int64(f.mode), 8), tmp); err != nil {
			return changed, err
		}
		if err := p.runIn(ctx, id, "mv", "-f", tmp, full); err != nil {
			return changed, err
		}
		changed++
	}
	// What the volumes hold now: what they should, and the files of
	// objects that have gone (left as they were).
	now := slices.Collect(maps.Keys(want))
	for _, full := range had {
		if _, ok := want[full]; ok {
			continue
		}
		if slices.ContainsFunc(kept, func(dir string) bool { return strings.HasPrefix(full, dir+"/") }) {
			now = append(now, full)
			continue
		}
		if err := p.runIn(ctx, id, "rm", "-f", full); err != nil {
			return changed, err
		}
		changed++
	}
	slices.Sort(now)
	p.mu.Lock()
	ps.volFiles = now
	p.mu.Unlock()
	return changed, err
}

// syncVolumesEvery keeps the pod's file volumes up to date until its
// context ends, skipping while its sandbox is paused.
func (p *Pods) syncVolumesEvery(ps *podState, every time.Duration) {
	if len(ps.plan.files) == 0 || every <= 0 {
		return
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-ps.ctx.Done():
				return
			case <-t.C:
			}
			p.mu.Lock()
			id, paused, gone := ps.sandboxID, ps.pz.paused, ps.reason != "" || ps.deleted
			p.mu.Unlock()
			if paused || id == "" {
				continue
			}
			if gone {
				return
			}
			n, err := p.syncVolumes(ps.ctx, ps, id)
			switch {
			case err != nil && ps.ctx.Err() == nil:
				p.log.Info("volume_sync_incomplete", "pod", key(ps.pod.Namespace, ps.pod.Name), "err", err)
			case n > 0:
				p.log.Info("volume_synced", "pod", key(ps.pod.Namespace, ps.pod.Name), "files", n)
			}
		}
	}()
}

// runIn runs a command of the template in sandbox id as its root and fails
// unless it exits 0.
func (p *Pods) runIn(ctx context.Context, id, cmd string, args ...string) error {
	var out strings.Builder
	code, err := p.sb.Exec(ctx, id, client.ExecRequest{Cmd: cmd, Args: args, User: "root", Stdout: &out, Stderr: &out})
	if err == nil && code != 0 {
		err = fmt.Errorf("%s exited with %d: %s", cmd, code, strings.TrimSpace(out.String()))
	}
	return err
}
