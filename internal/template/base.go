package template

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The Debian release and package set of the base template. Changing any of
// them changes baseHash, so the next build fetches a fresh debootstrap.
const (
	baseSuite          = "bookworm"
	baseVariant        = "minbase"
	baseRecipeVersion  = "base/2"
	debootstrapTimeout = 30 * time.Minute
)

// basePackages is what --include adds to minbase: a shell, an interpreter,
// the usual tools an agent reaches for, TLS roots, and ip and nc so users
// can see for themselves what the egress policy lets through; and what
// E2B's base image has, which its SDK's users assume: python (and
// python3) with pip, node with npm, sudo for the user account. The list is
// part of the debootstrap cache key (baseHash): changing it rebuilds.
var basePackages = []string{
	"bash",
	"ca-certificates",
	"coreutils",
	"curl",
	"git",
	"iproute2",
	"less",
	"netbase",
	"netcat-openbsd",
	"nodejs",
	"procps",
	"python-is-python3",
	"python3",
	"python3-pip",
	"sudo",
	"xz-utils",
}

// baseAptPackages are installed with apt inside the debootstrap result,
// after it: debootstrap's own resolver does not follow virtual packages
// (Provides), which npm's dependencies need. Part of the cache key too.
var baseAptPackages = []string{"npm"}

func baseHash(s *Store) (string, error) {
	pkgs := slices.Clone(basePackages)
	slices.Sort(pkgs)
	h := sha256.New()
	for _, part := range []string{baseRecipeVersion, baseSuite, baseVariant, s.cfg.Mirror, strings.Join(pkgs, ","), "apt:" + strings.Join(baseAptPackages, ",")} {
		h.Write([]byte(part + "\x00"))
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// debootstrapCacheDir is where the raw (unshifted) debootstrap result for
// the current package set and mirror lives.
func (s *Store) debootstrapCacheDir() (string, error) {
	hash, err := baseHash(s)
	if err != nil {
		return "", err
	}
	return filepath.Join(s.cfg.CacheDir, "debootstrap", baseSuite+"-"+shortHash(hash)), nil
}

// buildBase copies the cached debootstrap result (running debootstrap first
// if there is none) into dst with shifted ownership, then adds the user
// account and berth's mount point.
func buildBase(ctx context.Context, s *Store, dst string, log io.Writer) error {
	cache, err := s.ensureDebootstrap(ctx, log)
	if err != nil {
		return err
	}
	fmt.Fprintf(log, "==> copying %s into the template, shifting owners by %d\n", cache, s.cfg.UIDBase)
	start := time.Now()
	if err := shiftCopy(ctx, cache, dst, s.cfg.UIDBase, skipBase); err != nil {
		return fmt.Errorf("copy debootstrap result: %w", err)
	}
	fmt.Fprintf(log, "copied in %s\n", time.Since(start).Round(time.Millisecond))
	return finishBase(layerWriter{root: dst, base: s.cfg.UIDBase})
}

// skipBase leaves out what a sandbox does not need from a debootstrap
// result: downloaded packages and package lists (apt-get update refetches
// them), and device nodes (runc provides /dev; shiftCopy skips those anyway).
func skipBase(rel string, st *unix.Stat_t) bool {
	dir, name := filepath.Split(rel)
	switch dir {
	case "var/cache/apt/archives/":
		return strings.HasSuffix(name, ".deb")
	case "var/lib/apt/lists/":
		return st.Mode&unix.S_IFMT == unix.S_IFREG && name != "lock"
	case "var/cache/apt/":
		return strings.HasSuffix(name, ".bin") // pkgcache.bin, srcpkgcache.bin
	}
	return false
}

// finishBase turns the debootstrap result into berth's base: a non-root
// user with a home, neutral host identity files, and the /.berth mount point.
func finishBase(w layerWriter) error {
	for _, l := range []struct{ file, line string }{
		{"etc/passwd", "user:x:1000:1000:user:/home/user:/bin/bash"},
		{"etc/group", "user:x:1000:"},
		{"etc/shadow", "user:*:19000:0:99999:7:::"},
		{"etc/gshadow", "user:!::"},
	} {
		if err := w.appendLine(l.file, l.line); err != nil {
			return fmt.Errorf("add user: %w", err)
		}
	}
	if err := w.dir("home/user", 0o755, 1000, 1000); err != nil {
		return err
	}
	skel, err := os.ReadDir(w.path("etc/skel"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	for _, e := range skel {
		if !e.Type().IsRegular() {
			continue
		}
		if err := w.copyFile(filepath.Join(w.path("etc/skel"), e.Name()), "home/user/"+e.Name(), 0o644, 1000, 1000); err != nil {
			return err
		}
	}
	if err := w.dir(".berth", 0o755, 0, 0); err != nil {
		return err
	}
	// As on E2B's base: user may sudo without a password, and pip installs
	// system-wide (E2B's pipInstall runs `pip install` as root), which
	// Debian's python otherwise refuses (PEP 668).
	if err := w.dir("etc/sudoers.d", 0o755, 0, 0); err != nil {
		return err
	}
	if err := w.file("etc/sudoers.d/user", "user ALL=(ALL:ALL) NOPASSWD: ALL\n", 0o440, 0, 0); err != nil {
		return err
	}
	if err := w.file("etc/pip.conf", "[global]\nbreak-system-packages = true\n", 0o644, 0, 0); err != nil {
		return err
	}
	// debootstrap copies the build host's resolv.conf and hostname; the
	// sandbox gets its own from the runtime, so ship neutral ones.
	files := []struct{ rel, content string }{
		{"etc/hosts", layerHosts},
		{"etc/hostname", "berth\n"},
		{"etc/resolv.conf", "# provided by berth at sandbox start\n"},
	}
	for _, f := range files {
		if err := w.file(f.rel, f.content, 0o644, 0, 0); err != nil {
			return err
		}
	}
	return nil
}

// ensureDebootstrap returns the cached raw debootstrap result, running
// debootstrap into a temporary directory and renaming it into place if
// there is none. The cache is shared by every data dir on the host, so it
// is locked across processes.
func (s *Store) ensureDebootstrap(ctx context.Context, log io.Writer) (string, error) {
	final, err := s.debootstrapCacheDir()
	if err != nil {
		return "", err
	}
	parent := filepath.Dir(final)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return "", fmt.Errorf("debootstrap cache: %w", err)
	}
	release, err := flock(ctx, filepath.Join(parent, "."+filepath.Base(final)+".lock"))
	if err != nil {
		return "", fmt.Errorf("lock debootstrap cache: %w", err)
	}
	defer release()
	if fi, err := os.Stat(final); err == nil && fi.IsDir() {
		fmt.Fprintf(log, "==> using cached debootstrap result %s\n", final)
		return final, nil
	}
	// We hold the lock: temp dirs for this key are from builds that died.
	prefix := ".tmp-" + filepath.Base(final) + "-"
	if entries, err := os.ReadDir(parent); err == nil {
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), prefix) {
				os.RemoveAll(filepath.Join(parent, e.Name()))
			}
		}
	}
	tmp := filepath.Join(parent, prefix+randHex(4))
	if err := os.Mkdir(tmp, 0o755); err != nil {
		return "", fmt.Errorf("debootstrap cache: %w", err)
	}
	if err := s.runDebootstrap(ctx, tmp, log); err != nil {
		if rerr := os.RemoveAll(tmp); rerr != nil {
			s.log.Warn("remove partial debootstrap", "path", tmp, "err", rerr)
		}
		return "", err
	}
	if err := syncFS(tmp); err != nil {
		os.RemoveAll(tmp)
		return "", fmt.Errorf("debootstrap cache: %w", err)
	}
	if err := os.Rename(tmp, final); err != nil {
		os.RemoveAll(tmp)
		return "", fmt.Errorf("debootstrap cache: %w", err)
	}
	if err := syncDir(parent); err != nil {
		return "", fmt.Errorf("debootstrap cache: %w", err)
	}
	return final, nil
}

// runDebootstrap runs debootstrap into target, its output going to log.
// It runs in its own process group, so cancelling stops dpkg and friends
// too, and in a private mount namespace, so the /proc and /sys it mounts
// inside target vanish with it however it ends: removing a half-built
// target can then never descend into a live /proc.
func (s *Store) runDebootstrap(ctx context.Context, target string, log io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, debootstrapTimeout)
	defer cancel()
	args := []string{
		"--variant=" + baseVariant,
		"--include=" + strings.Join(basePackages, ","),
		baseSuite, target, s.cfg.Mirror,
	}
	fmt.Fprintf(log, "==> debootstrap %s\n", strings.Join(args, " "))
	s.log.Info("debootstrap started", "target", target, "mirror", s.cfg.Mirror)
	if err := s.runTree(ctx, log, s.cfg.DebootstrapPath, args...); err != nil {
		return fmt.Errorf("debootstrap (output above): %w", err)
	}
	if len(baseAptPackages) == 0 {
		return nil
	}
	// apt in the new tree, through its own sources (the same mirror),
	// with /proc for dpkg's maintainer scripts: the private mount
	// namespace drops the mount when the command ends.
	apt := append([]string{"-c", `chroot="$1"; shift; mount -t proc proc "$0/proc" && "$chroot" "$0" apt-get update && exec "$chroot" "$0" apt-get install -y --no-install-recommends "$@"`, target, s.cfg.ChrootPath}, baseAptPackages...)
	fmt.Fprintf(log, "==> apt-get install %s in the new tree\n", strings.Join(baseAptPackages, " "))
	if err := s.runTree(ctx, log, "/bin/sh", apt...); err != nil {
		return fmt.Errorf("apt-get install %s (output above): %w", strings.Join(baseAptPackages, " "), err)
	}
	return nil
}

// runTree runs a step of building the debootstrap tree, its output going
// to log, in its own process group (cancelling stops dpkg and friends too)
// and in a private mount namespace, so the /proc and /sys it mounts inside
// the tree vanish with it however it ends.
func (s *Store) runTree(ctx context.Context, log io.Writer, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdout = log
	cmd.Stderr = log
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive", "LC_ALL=C")
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Setpgid:      true,
		Unshareflags: syscall.CLONE_NEWNS,
	}
	cmd.Cancel = func() error {
		return syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
	}
	// SIGTERM lets debootstrap's traps run; stragglers are killed below.
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Run(); err != nil {
		if cmd.Process != nil {
			// Anything left in the group (a dpkg that ignored SIGTERM,
			// a child holding the output pipe) dies now.
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		}
		if cerr := ctx.Err(); cerr != nil {
			return fmt.Errorf("%s: %w", name, cerr)
		}
		return err
	}
	return nil
}
