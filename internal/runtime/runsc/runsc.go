// Package runsc is the gVisor runtime backend: each sandbox runs under
// gVisor's runsc, whose sentry (a user-space kernel) serves the sandbox's
// system calls, so a sandbox process never talks to the host kernel.
//
// runsc speaks runc's command line, so the sandbox's host side (uid range,
// disk image and idmapped overlay root, cgroups, teardown, recovery) is
// the runc backend's, run in its gVisor mode (runc.Config.GVisor; the
// differences are in internal/runtime/runc/gvisor.go). This package adds
// what only gVisor has: choosing and probing the binary and the platform,
// reporting the version, and checkpoint/restore.
package runsc

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/runtime"
	"github.com/berth-sandbox/berth/internal/runtime/runc"
)

// Platforms runsc can intercept system calls with.
const (
	PlatformPtrace  = "ptrace"
	PlatformSystrap = "systrap"
	PlatformKVM     = "kvm"
)

// Config configures a Runtime. The directory and uid fields mean what
// they mean in runc.Config and must not be shared with a runc Runtime
// (each backend needs its own StateDir, RunscRoot and CgroupParent; the
// SlotDir is host-wide and shared).
type Config struct {
	// Binary is runsc; default "runsc" looked up on PATH, so a newer
	// runsc installed ahead of Debian's /usr/bin/runsc is the one used.
	Binary              string
	StateDir, RunscRoot string
	CgroupParent        string
	UIDBase, UIDCount   uint32
	SlotDir             string
	DiskPoolDir         string
	DiskPoolDepth       int
	// Platform is "ptrace", "systrap", "kvm" or "" to probe: kvm when
	// /dev/kvm exists and a trial sandbox on it runs within ProbeTimeout,
	// else systrap when this runsc has it (releases from mid-2023 on),
	// else ptrace. (A nested, paravirtual /dev/kvm can hang runsc's kvm
	// platform; the bound catches that.)
	Platform     string
	ProbeTimeout time.Duration // default 20s
	Logger       *slog.Logger
}

// Runtime is a runc.Runtime in gVisor mode plus what is gVisor's own.
type Runtime struct {
	*runc.Runtime
	bin      string
	version  string
	platform string
	setuid   bool
}

// New finds runsc, settles the platform and returns a Runtime. A host
// without runsc gets ErrUnavailable naming what to install.
func New(ctx context.Context, cfg Config) (*Runtime, error) {
	if cfg.Binary == "" {
		cfg.Binary = "runsc"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	bin, err := exec.LookPath(cfg.Binary)
	if err != nil {
		return nil, fmt.Errorf("gvisor: %s not found (install Debian's runsc package, or a gVisor release, on PATH): %w", cfg.Binary, errdefs.ErrUnavailable)
	}
	version, err := Version(ctx, bin)
	if err != nil {
		return nil, fmt.Errorf("gvisor: %w: %w", err, errdefs.ErrUnavailable)
	}
	platform := cfg.Platform
	switch platform {
	case PlatformPtrace, PlatformKVM:
	case PlatformSystrap:
		if !hasSystrap(version) {
			return nil, fmt.Errorf("gvisor: platform %q: runsc %s predates it; want ptrace or kvm, or a newer runsc: %w", platform, version, errdefs.ErrInvalidArgument)
		}
	case "":
		platform = probePlatform(ctx, bin, version, cfg.ProbeTimeout, cfg.Logger)
	default:
		return nil, fmt.Errorf("gvisor: platform %q: want ptrace, systrap or kvm: %w", platform, errdefs.ErrInvalidArgument)
	}
	flags, err := runscFlags(ctx, bin)
	if err != nil {
		return nil, fmt.Errorf("gvisor: %w: %w", err, errdefs.ErrUnavailable)
	}
	setuid := hasFlag(flags, "allow-suid")
	copies := hasFlag(flags, "restore-spec-validation")
	image, err := imageFlags(ctx, bin)
	if err != nil {
		return nil, fmt.Errorf("gvisor: %w: %w", err, errdefs.ErrUnavailable)
	}
	runHelp, err := commandHelp(ctx, bin, "run")
	if err != nil {
		return nil, fmt.Errorf("gvisor: %w: %w", err, errdefs.ErrUnavailable)
	}
	passFD := hasFlag(runHelp, "pass-fd")
	r, err := runc.New(runc.Config{
		Binary:        bin,
		StateDir:      cfg.StateDir,
		RuncRoot:      cfg.RunscRoot,
		CgroupParent:  cfg.CgroupParent,
		UIDBase:       cfg.UIDBase,
		UIDCount:      cfg.UIDCount,
		SlotDir:       cfg.SlotDir,
		DiskPoolDir:   cfg.DiskPoolDir,
		DiskPoolDepth: cfg.DiskPoolDepth,
		GVisor: &runc.GVisor{
			Platform:           platform,
			HideNetSysctl:      probesRmemDefault(version),
			AllowSUID:          setuid,
			ResumeBeforeDelete: deletePanicsWhenPaused(version),
			// A resume returns once the kernel state is in, the
			// pages follow (README, "Background restores"); a load
			// that fails after that ends the sandbox with the reason
			// (sandbox.PageLoader, WaitRestored).
			BackgroundRestore: image.background,
			DirectImageIO:     image.direct,
			PrepareRestore:    image.background,
			RestoreCopies:     copies,
			MountsGap:         mountsGap(version),
			PassFD:            passFD,
		},
		Logger: cfg.Logger,
	})
	if err != nil {
		return nil, fmt.Errorf("gvisor: %w", err)
	}
	cfg.Logger.Info("gvisor runtime", "binary", bin, "version", version, "platform", platform, "setuid", setuid, "memory_copies", copies, "background_restore", image.background, "direct_image_io", image.direct, "agent_secret_by_fd", passFD)
	return &Runtime{Runtime: r, bin: bin, version: version, platform: platform, setuid: setuid}, nil
}

// Version is the runsc version, e.g. "0.0~20221219.0" (Debian),
// "release-20260817.0" (a gVisor release) or "go-20260701204157-69c2d17aea96"
// (built from source by scripts/runsc-bin.sh), for `berth version` and
// inspect.
func (r *Runtime) Version() string { return r.version }

// Binary is the runsc binary's path.
func (r *Runtime) Binary() string { return r.bin }

// Platform is the platform sandboxes run on.
func (r *Runtime) Platform() string { return r.platform }

// RaisesSetuid reports whether set-user-ID programs (sudo) raise a
// process in a sandbox created with runtime.Spec.AllowSetuid: this runsc
// has --allow-suid. Without it the sentry ignores the bit, and
// AllowSetuid has no effect.
func (r *Runtime) RaisesSetuid() bool { return r.setuid }

// runscFlags returns the global flags the runsc at bin lists (`runsc
// flags`), which say what it can: Berth asks the binary rather than
// guessing from its version, as builds from source carry no release date
// of a flag's arrival.
func runscFlags(ctx context.Context, bin string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	// runsc prints the list on stderr.
	out, err := exec.CommandContext(ctx, bin, "flags").CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("%s flags: %w", bin, err)
	}
	return out, nil
}

// imageIO is what the runsc at hand can do with a checkpoint image's
// files, asked of the binary (`runsc help checkpoint`, `runsc help
// restore`) rather than guessed from its version: builds from source
// carry no release date of a flag's arrival. Debian's 20221219 has none
// of it.
type imageIO struct {
	// background: `restore --background` (the sentry loads the memory
	// pages while the sandbox runs) and `checkpoint --compression`, whose
	// "none" writes the uncompressed image a background load needs (a
	// release with the flag but another default would compress it, and
	// the background load would then silently load everything first).
	background bool
	// direct: --direct on both commands (the sentry writes and reads the
	// pages file with O_DIRECT).
	direct bool
}

// imageFlags asks the runsc at bin for its imageIO.
func imageFlags(ctx context.Context, bin string) (imageIO, error) {
	cp, err := commandHelp(ctx, bin, "checkpoint")
	if err != nil {
		return imageIO{}, err
	}
	rs, err := commandHelp(ctx, bin, "restore")
	if err != nil {
		return imageIO{}, err
	}
	return imageIOIn(cp, rs), nil
}

// commandHelp is `runsc help <cmd>` of the runsc at bin, which lists the
// command's flags. runsc prints it on stdout or stderr, depending on the
// release: both are read.
func commandHelp(ctx context.Context, bin, cmd string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "help", cmd).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("%s help %s: %w", bin, cmd, err)
	}
	return out, nil
}

// imageIOIn reads imageFlags' answer from the output of `runsc help
// checkpoint` and `runsc help restore`.
func imageIOIn(checkpointHelp, restoreHelp []byte) imageIO {
	return imageIO{
		background: hasFlag(restoreHelp, "background") && hasFlag(checkpointHelp, "compression"),
		direct:     hasFlag(restoreHelp, "direct") && hasFlag(checkpointHelp, "direct"),
	}
}

// hasFlag reports whether `runsc flags` or `runsc help <command>` output
// lists flag name (a line "  -name" or "  -name value").
func hasFlag(out []byte, name string) bool {
	for line := range strings.Lines(string(out)) {
		f := strings.Fields(line)
		if len(f) > 0 && f[0] == "-"+name {
			return true
		}
	}
	return false
}

// Version asks the runsc binary at bin for its version.
func Version(ctx context.Context, bin string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "--version").Output()
	if err != nil {
		return "", fmt.Errorf("%s --version: %w", bin, err)
	}
	// "runsc version 0.0~20221219.0\nspec: 1.0.2-dev\n"
	first, _, _ := strings.Cut(string(out), "\n")
	v, ok := strings.CutPrefix(strings.TrimSpace(first), "runsc version ")
	if !ok || v == "" {
		return "", fmt.Errorf("%s --version printed %q", bin, first)
	}
	return v, nil
}

// versionDate is the build date, YYYYMMDD, in a runsc version:
// "0.0~YYYYMMDD.N" (Debian), "release-YYYYMMDD.N" (gVisor releases) or
// "go-YYYYMMDDhhmmss-commit" (scripts/runsc-bin.sh). "" if the form is
// unknown.
func versionDate(version string) string {
	v := version
	for _, p := range []string{"0.0~", "release-", "go-"} {
		v = strings.TrimPrefix(v, p)
	}
	if len(v) < 8 {
		return ""
	}
	for _, c := range v[:8] {
		if c < '0' || c > '9' {
			return ""
		}
	}
	if len(v) > 8 && v[8] != '.' && (v[8] < '0' || v[8] > '9') {
		return ""
	}
	return v[:8]
}

// probesRmemDefault reports whether runsc version tells the host's
// network namespace by /proc/sys/net/core/rmem_default, as releases before
// 2024-08-01 do (runc.GVisor.HideNetSysctl). An unknown version is taken
// as old, which costs only the shim.
func probesRmemDefault(version string) bool {
	date := versionDate(version)
	return date == "" || date < "20240801"
}

// hasSystrap reports whether runsc version has the systrap platform,
// runsc's default since mid-2023 (Debian bookworm's 2022 build has only
// ptrace and kvm). An unknown version is taken as old.
func hasSystrap(version string) bool {
	date := versionDate(version)
	return date != "" && date >= "20230601"
}

// deletePanicsWhenPaused reports whether runsc version may panic deleting
// a paused sandbox (runc.GVisor.ResumeBeforeDelete): Debian's 2022 build
// does, current ones let every state go to stopped. When upstream changed
// it is not known; releases with systrap (mid-2023 on) stand in for the
// fixed ones, and an unknown version is taken as old, which costs only a
// `runsc resume` of a paused sandbox before its delete.
func deletePanicsWhenPaused(version string) bool {
	return !hasSystrap(version)
}

// mountsGap says why runsc version cannot bind volumes, "" when it can:
// Debian's 2022 build dies at start on any bind mount of a host directory
// besides the root's ("error reading mounts file"). Which release fixed
// it is not known; as for deletePanicsWhenPaused, releases with systrap
// stand in for the fixed ones, and an unknown version is taken as old.
func mountsGap(version string) string {
	if hasSystrap(version) {
		return ""
	}
	return "runsc " + version + " cannot bind a host directory into a sandbox (releases from mid-2023 can)"
}

// probePlatform picks kvm if /dev/kvm exists and a trial sandbox on it
// runs to completion within timeout, else systrap if runsc has it, else
// ptrace. Systrap intercepts system calls with seccomp and shared memory
// instead of a ptrace stop per call: much faster, and it keeps up with a
// process storm that ptrace's per-thread tracer cannot.
func probePlatform(ctx context.Context, bin, version string, timeout time.Duration, log *slog.Logger) string {
	fallback := PlatformPtrace
	if hasSystrap(version) {
		fallback = PlatformSystrap
	}
	if _, err := os.Stat("/dev/kvm"); err != nil {
		return fallback
	}
	if timeout <= 0 {
		timeout = 20 * time.Second
	}
	key := platformKey(bin, version)
	if p, why, ok := cachedPlatform(platformCacheDir, key); ok && (p == PlatformKVM || p == fallback) {
		if p != PlatformKVM {
			log.Warn("gvisor kvm platform unusable", "err", why, "using", fallback, "cached", true)
		}
		return p
	}
	if err := trial(ctx, bin, PlatformKVM, timeout); err != nil {
		log.Warn("gvisor kvm platform unusable", "err", err, "using", fallback)
		if ctx.Err() == nil {
			cachePlatform(platformCacheDir, key, fallback, err.Error(), log)
		}
		return fallback
	}
	cachePlatform(platformCacheDir, key, PlatformKVM, "", log)
	return PlatformKVM
}

// platformCacheDir keeps, per boot of the host, the platform the kvm
// trial chose for each runsc binary: a hung trial costs its whole timeout,
// which every daemon start (each test's) would otherwise pay again.
var platformCacheDir = "/run/berth/runsc-platform"

// platformKey names a runsc binary and version in the cache.
func platformKey(bin, version string) string {
	sum := sha256.Sum256([]byte(bin + "\x00" + version))
	return hex.EncodeToString(sum[:8])
}

// bootID is this boot of the host's ID; "" if unknown.
func bootID() string {
	id, err := runtime.HostBootID()
	if err != nil {
		return ""
	}
	return id
}

// cachedPlatform reads the platform (and why kvm was not it) the trial
// chose for key in this boot.
func cachedPlatform(dir, key string) (platform, why string, ok bool) {
	boot := bootID()
	if boot == "" {
		return "", "", false
	}
	b, err := os.ReadFile(filepath.Join(dir, key))
	if err != nil {
		return "", "", false
	}
	lines := strings.SplitN(string(b), "\n", 3)
	if len(lines) < 2 || lines[0] != boot {
		return "", "", false
	}
	if len(lines) == 3 {
		why = strings.TrimSpace(lines[2])
	}
	return lines[1], why, true
}

// cachePlatform records the trial's choice for key in this boot, written
// whole (rename) so a reader never sees half of it.
func cachePlatform(dir, key, platform, why string, log *slog.Logger) {
	boot := bootID()
	if boot == "" {
		return
	}
	err := os.MkdirAll(dir, 0o755)
	var f *os.File
	if err == nil {
		f, err = os.CreateTemp(dir, key+".*")
	}
	if err == nil {
		_, err = fmt.Fprintf(f, "%s\n%s\n%s\n", boot, platform, strings.ReplaceAll(why, "\n", " "))
		err = errors.Join(err, f.Close())
		if err == nil {
			err = os.Rename(f.Name(), filepath.Join(dir, key))
		}
		if err != nil {
			_ = os.Remove(f.Name())
		}
	}
	if err != nil {
		log.Debug("gvisor_platform_not_cached", "err", err)
	}
}

// trial runs `runsc do true` on platform with a throwaway root.
func trial(ctx context.Context, bin, platform string, timeout time.Duration) error {
	root, err := os.MkdirTemp("", "berth-runsc-probe-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(root)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "--root", root, "--platform="+platform, "--network=none", "do", "true")
	// A hung trial leaves a sandbox and a gofer behind its `do`: they are
	// in its process group, which a timeout kills whole.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Run()
	if ctx.Err() != nil {
		return fmt.Errorf("trial sandbox on %s did not finish within %v", platform, timeout)
	}
	if err != nil {
		return errors.Join(err, errors.New(strings.TrimSpace(out.String())))
	}
	return nil
}
