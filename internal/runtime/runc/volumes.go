package runc

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/runtime"
)

// A Spec's Mounts (volumes) are host directories owned by the canonical
// uid range, like the template layers. Each is seen by the sandbox through
// an idmapped clone of its mount mapping that range onto the sandbox's
// slot, attached under StateDir/<id>/vol/N only while runc (or runsc's
// gofer) binds it into the sandbox's own mount namespace, and detached
// right after: the sandbox keeps its bind, the host keeps nothing. A crash
// in between leaves the clone under the sandbox's state dir, where
// Destroy's unmountAll and Start's Stop find it like any other mount.

// volDir is where a sandbox's volume clones are attached while it starts.
func (r *Runtime) volDir(id string) string { return filepath.Join(r.dir(id), "vol") }

// volPath is the attach point of the sandbox's i-th mount.
func (r *Runtime) volPath(id string, i int) string {
	return filepath.Join(r.volDir(id), strconv.Itoa(i))
}

// MountsGap says why this runtime cannot bind runtime.Spec.Mounts, ""
// when it can.
func (r *Runtime) MountsGap() string {
	if r.cfg.GVisor != nil {
		return r.cfg.GVisor.MountsGap
	}
	return ""
}

// checkMounts says which of s.Mounts cannot be bound.
func (r *Runtime) checkMounts(s runtime.Spec) error {
	if gap := r.MountsGap(); gap != "" && len(s.Mounts) > 0 {
		return fmt.Errorf("bind volumes: %s: %w", gap, errdefs.ErrNotImplemented)
	}
	seen := map[string]bool{}
	for i, m := range s.Mounts {
		if !filepath.IsAbs(m.Source) {
			return fmt.Errorf("mount %d: source %q is not absolute: %w", i, m.Source, errdefs.ErrInvalidArgument)
		}
		if err := runtime.CheckMountDestination(m.Destination); err != nil {
			return fmt.Errorf("mount %d: %w: %w", i, err, errdefs.ErrInvalidArgument)
		}
		if seen[m.Destination] {
			return fmt.Errorf("mount %d: %s is bound twice: %w", i, m.Destination, errdefs.ErrInvalidArgument)
		}
		seen[m.Destination] = true
	}
	return nil
}

// volumeMounts are the OCI bind mounts of the sandbox's volumes, from
// their attach points.
func (r *Runtime) volumeMounts(s runtime.Spec) []specs.Mount {
	out := make([]specs.Mount, 0, len(s.Mounts))
	for i, m := range s.Mounts {
		opts := []string{"bind", "nosuid", "nodev"}
		if m.ReadOnly {
			opts = append(opts, "ro")
		}
		out = append(out, specs.Mount{Destination: m.Destination, Type: "bind", Source: r.volPath(s.ID, i), Options: opts})
	}
	return out
}

// attachVolumes attaches the idmapped clone of each of s.Mounts for a
// sandbox whose root is host uid uid; the returned func detaches them
// (the sandbox's own binds stay). Nothing is attached for a spec without
// mounts.
func (r *Runtime) attachVolumes(s runtime.Spec, uid uint32) (detach func() error, err error) {
	if len(s.Mounts) == 0 {
		return func() error { return nil }, nil
	}
	ns, err := r.idmaps.get(r.cfg.UIDBase, uid, r.cfg.UIDCount)
	if err != nil {
		return nil, err
	}
	dir := r.volDir(s.ID)
	// Left by a crash: nothing the sandbox holds lives here.
	if err := detachVolumes(dir); err != nil {
		return nil, err
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, err
	}
	detach = func() error { return detachVolumes(dir) }
	for i, m := range s.Mounts {
		fi, err := os.Stat(m.Source)
		if err != nil || !fi.IsDir() {
			_ = detach() // err says why
			return nil, fmt.Errorf("mount %d: source %s is not a directory: %w", i, m.Source, errdefs.ErrInvalidArgument)
		}
		target := r.volPath(s.ID, i)
		if err := os.Mkdir(target, 0o700); err != nil {
			_ = detach()
			return nil, err
		}
		if err := mountIdmapped(m.Source, target, ns, m.ReadOnly); err != nil {
			_ = detach()
			return nil, fmt.Errorf("mount %d: %w", i, err)
		}
	}
	return detach, nil
}

// detachVolumes detaches whatever is attached under dir and removes it.
func detachVolumes(dir string) error {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range ents {
		p := filepath.Join(dir, e.Name())
		if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", p, err))
			continue
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if len(errs) == 0 {
		if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
