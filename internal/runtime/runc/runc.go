// Package runc is the container runtime backend: it runs each sandbox as an
// OCI container under runc (or a CLI-compatible runtime), in its own user,
// pid, mount, ipc, uts, cgroup and network namespaces, on an overlay root
// filesystem whose writable layer lives in a size-capped ext4 image.
//
// The package keeps no state in memory: everything it knows about a
// sandbox is on disk (StateDir/<id>, runc's state under RuncRoot, the
// mount table and the cgroup tree), so a restarted daemon sees exactly what
// the previous one left and can adopt or destroy it.
package runc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/diskimg"
	"github.com/berth-sandbox/berth/internal/runtime"
)

// Config configures a Runtime.
type Config struct {
	// Binary is the OCI runtime CLI; default "runc".
	Binary string
	// StateDir holds one directory per sandbox: config.json, rootfs/,
	// disk.img, disk/, uid-slot (its uid range) and, while its overlay is
	// being mounted, lower/ (the idmapped layers).
	StateDir string
	// RuncRoot is the runtime's own state directory (runc --root); it must
	// be distinct per daemon.
	RuncRoot string
	// CgroupParent is the cgroup every sandbox's cgroup sits under, e.g.
	// "berth-<instance>".
	CgroupParent string
	// UIDBase and UIDCount are the canonical range: template layers on
	// disk are owned by UIDBase+uid for sandbox uids 0..UIDCount-1. No
	// sandbox runs in it; each gets its own host range of UIDCount ids
	// (uidslot.go) and sees the layers through idmapped mounts. Defaults
	// 1000000 and 65536 (the most allowed).
	UIDBase, UIDCount uint32
	// SlotDir holds the host-wide claims on sandbox uid ranges; every
	// daemon on a host must use the same one. Default /run/berth/uid-slots.
	SlotDir string
	// DiskPoolDir, when set, holds formatted disk images kept ready so a
	// create skips mkfs; it must be on the same filesystem as StateDir and
	// belongs to this Runtime alone (it is emptied at start).
	DiskPoolDir string
	// DiskPoolDepth is how many spare images of each size are kept (2).
	DiskPoolDepth int
	// GVisor, when set, runs sandboxes under gVisor's runsc instead of
	// runc (gvisor.go); Binary then defaults to "runsc".
	GVisor *GVisor
	Logger *slog.Logger
}

// Runtime creates and tears down runc sandboxes. It is safe for concurrent
// use on distinct sandbox IDs.
type Runtime struct {
	cfg      Config
	log      *slog.Logger
	cg       cgroupLayout
	swapAcct bool     // swap accounting exists, so memory+swap can be capped
	nofile   uint64   // RLIMIT_NOFILE for sandboxes
	nsNproc  bool     // the kernel counts RLIMIT_NPROC per user namespace
	calls    inflight // runtime CLI calls under way per sandbox (removeState waits)
	// sigpending and msgqueue are the sandbox's RLIMIT_SIGPENDING and
	// RLIMIT_MSGQUEUE (poolRlimits), capped at the daemon's own.
	sigpending, msgqueue uint64
	pool                 *diskPool
	slots                *slots
	idmaps               idmapNS
	proc                 string // where /proc is; "" is /proc (a seam for tests)
	// sentrySamples holds each gVisor sandbox's last sentryStats answer
	// (sentrySample by sandbox ID), for defaultSentryStatsTTL (or
	// sentryStatsTTL when set: a seam for tests).
	sentrySamples  sync.Map
	sentryStatsTTL time.Duration
	// runscAnswers holds each gVisor sandbox's last `runsc state` answer
	// about a live sentry (runscAnswer by sandbox ID; runscState).
	runscAnswers sync.Map
}

// New checks the configuration and the host and returns a Runtime.
func New(cfg Config) (*Runtime, error) {
	if cfg.Binary == "" {
		cfg.Binary = "runc"
		if cfg.GVisor != nil {
			cfg.Binary = "runsc"
		}
	}
	if cfg.UIDBase == 0 {
		cfg.UIDBase = 1000000
	}
	if cfg.UIDCount == 0 {
		cfg.UIDCount = 65536
	}
	if cfg.SlotDir == "" {
		cfg.SlotDir = defaultSlotDir
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.StateDir == "" || cfg.RuncRoot == "" || cfg.CgroupParent == "" {
		return nil, fmt.Errorf("runc: StateDir, RuncRoot and CgroupParent are required: %w", errdefs.ErrInvalidArgument)
	}
	if !filepath.IsAbs(cfg.StateDir) || !filepath.IsAbs(cfg.RuncRoot) {
		return nil, fmt.Errorf("runc: StateDir and RuncRoot must be absolute: %w", errdefs.ErrInvalidArgument)
	}
	cfg.CgroupParent = strings.Trim(cfg.CgroupParent, "/")
	bin, err := exec.LookPath(cfg.Binary)
	if err != nil {
		return nil, fmt.Errorf("runc: %w: %w", err, errdefs.ErrUnavailable)
	}
	cfg.Binary = bin
	for _, d := range []string{cfg.StateDir, cfg.RuncRoot} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("runc: %w", err)
		}
	}
	// runc sets up the rootfs from inside the sandbox's user namespace,
	// as a host uid that must be able to walk down to StateDir/<id>/rootfs:
	// search permission, no listing.
	if err := os.Chmod(cfg.StateDir, 0o711); err != nil {
		return nil, fmt.Errorf("runc: %w", err)
	}
	cg, err := detectCgroups()
	if err != nil {
		return nil, fmt.Errorf("runc: %w", err)
	}
	sl, err := newSlots(cfg.SlotDir, cfg.StateDir, cfg.UIDBase, cfg.UIDCount)
	if err != nil {
		return nil, fmt.Errorf("runc: %w", err)
	}
	r := &Runtime{cfg: cfg, log: cfg.Logger, cg: cg, swapAcct: cg.swapAccounting(), nofile: nofileLimit(), nsNproc: nprocPerUserNS(kernelRelease()), slots: sl}
	r.sigpending = cappedRlimit(unix.RLIMIT_SIGPENDING, sigpendingLimit)
	r.msgqueue = cappedRlimit(unix.RLIMIT_MSGQUEUE, msgqueueLimit)
	// Claims of a daemon killed between claiming a slot and making (or
	// after removing) the sandbox's state dir.
	sl.releaseOrphans(r.dir)
	if cfg.GVisor != nil {
		r.settleRestoreLimits()
	}
	if cfg.DiskPoolDir != "" {
		if cfg.DiskPoolDepth <= 0 {
			cfg.DiskPoolDepth = 2
		}
		if r.pool, err = newDiskPool(cfg.DiskPoolDir, cfg.DiskPoolDepth, cfg.Logger); err != nil {
			return nil, fmt.Errorf("runc: %w", err)
		}
	}
	return r, nil
}

// Warm prepares spare disk images of size in the background, so the next
// creates of that size skip mkfs, and the idmap namespaces of the uid
// slots the next creates will take (prefetchIdmaps): the daemon calls it at
// start.
func (r *Runtime) Warm(size int64) {
	if r.pool != nil {
		r.pool.warm(size)
	}
	r.prefetchIdmaps()
}

// idmapPrefetchDepth is how many uid slots ahead of the next claim have
// their idmap namespace made in advance.
const idmapPrefetchDepth = 2

// prefetchIdmaps makes, in the background, the idmap namespaces (through
// which runc and gVisor alike map the template layers) of the next uid
// slots a create will claim. (Making each sandbox's own user namespace
// ahead the same way was tried: on the 2-core test host it moved two
// process starts from beside the mounts to beside runc, and TTI did not
// move beyond the noise, so it is made per create, during the mounts.)
func (r *Runtime) prefetchIdmaps() {
	for _, k := range r.slots.upcoming(idmapPrefetchDepth) {
		r.idmaps.prefetch(r.cfg.UIDBase, hostBase(k), r.cfg.UIDCount, r.log)
	}
}

// Close stops background work and removes spare disk images. Sandboxes
// keep running.
func (r *Runtime) Close() {
	if r.pool != nil {
		r.pool.close()
	}
	r.idmaps.close()
	// The daemon's own cgroup parent goes once no sandbox is left under
	// it; with sandboxes still running rmdir fails and it stays, for the
	// next start to adopt them.
	for _, m := range r.cg.mounts {
		_ = unix.Rmdir(filepath.Join(m, r.cfg.CgroupParent))
	}
}

// checkID holds IDs to the sandbox-ID grammar, which keeps them safe as
// path components, cgroup names and runc container IDs.
func checkID(id string) error { return types.ValidSandboxID(id) }

func validID(id string) bool { return types.ValidSandboxID(id) == nil }

func (r *Runtime) dir(id string) string      { return filepath.Join(r.cfg.StateDir, id) }
func (r *Runtime) diskDir(id string) string  { return filepath.Join(r.dir(id), "disk") }
func (r *Runtime) image(id string) string    { return filepath.Join(r.dir(id), "disk.img") }
func (r *Runtime) rootfs(id string) string   { return filepath.Join(r.dir(id), "rootfs") }
func (r *Runtime) runcLog(id string) string  { return filepath.Join(r.dir(id), "runc.log") }
func (r *Runtime) panicLog(id string) string { return filepath.Join(r.dir(id), "panic.log") }

// CrashReport is the first lines of the sentry's crash report, under
// gVisor, where a sandbox whose sentry panicked says nothing else about
// why it is gone; "" on runc or when the sentry did not crash.
func (r *Runtime) CrashReport(id string) string {
	if r.cfg.GVisor == nil || checkID(id) != nil {
		return ""
	}
	b, err := os.ReadFile(r.panicLog(id))
	if err != nil {
		return ""
	}
	text := strings.TrimSpace(string(b[:min(len(b), 4096)]))
	if text == "" {
		return ""
	}
	lines := strings.SplitN(text, "\n", 4)
	return "sentry crash: " + strings.Join(lines[:min(len(lines), 3)], " | ")
}

// AgentLog is the host path of a sandbox's agent stdout/stderr. It lives in
// the sandbox's disk image, so its size counts against the sandbox's disk
// limit instead of the host's disk.
func (r *Runtime) AgentLog(id string) string { return filepath.Join(r.diskDir(id), "agent.log") }

// Create builds the sandbox's root filesystem and starts its agent. It
// returns once the agent process runs; on any failure everything done so
// far is undone.
func (r *Runtime) Create(ctx context.Context, spec runtime.Spec) (err error) {
	start := time.Now()
	phases := phaseTimer{last: start}
	if err := r.validate(spec); err != nil {
		return err
	}
	id := spec.ID
	if err := os.Mkdir(r.dir(id), 0o711); err != nil {
		if errors.Is(err, os.ErrExist) {
			return fmt.Errorf("sandbox %s: %w", id, errdefs.ErrAlreadyExists)
		}
		return fmt.Errorf("sandbox %s: %w", id, err)
	}
	// The image this create took from the pool is replaced once the
	// create is over, not beside it: mkfs would compete with runc and the
	// agent for the CPU while the caller waits.
	if r.pool != nil {
		defer r.pool.warm(spec.DiskBytes)
	}
	defer func() {
		if err == nil {
			return
		}
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if cerr := r.Destroy(cctx, id); cerr != nil {
			r.log.Error("undo failed create", "sandbox_id", id, "err", cerr)
			err = errors.Join(err, fmt.Errorf("undo: %w", cerr))
		}
	}()
	slot, err := r.slots.claim(id, r.dir(id))
	if err != nil {
		return fmt.Errorf("create sandbox %s: %w", id, err)
	}
	uid := hostBase(slot)
	var pending *pendingUserNS
	if r.cfg.GVisor == nil {
		// Two process starts (newUserNS), made while the root
		// filesystem is prepared.
		pending = startUserNS(ctx, r.idMappings(uid))
		defer pending.release()
	}
	phases.mark("uid_slot")
	if err := r.prepareRootfs(ctx, spec, uid, &phases); err != nil {
		return fmt.Errorf("create sandbox %s: %w", id, err)
	}
	if err := r.writeLayers(id, spec.Layers); err != nil {
		return fmt.Errorf("create sandbox %s: %w", id, err)
	}
	// The next creates' idmap namespaces (two short process starts
	// each) are made now, while this one waits on runc, rather than on
	// the next create's path or beside this one's mounts.
	r.prefetchIdmaps()
	if err := r.run(ctx, spec, uid, pending, &phases); err != nil {
		return fmt.Errorf("create sandbox %s: %w", id, err)
	}
	r.log.Debug("sandbox created", append([]any{"sandbox_id", id, "total", time.Since(start)}, phases.attrs...)...)
	return nil
}

// run starts the agent of a sandbox whose root filesystem is mounted, as
// host uid uid: Create's last step, and Start's. pending, when not nil,
// is the sandbox's user namespace, made meanwhile (runc only).
func (r *Runtime) run(ctx context.Context, spec runtime.Spec, uid uint32, pending *pendingUserNS, phases *phaseTimer) (err error) {
	id := spec.ID
	sp := r.ociSpec(spec, r.rootfs(id), uid)
	detach, err := r.attachVolumes(spec, uid)
	if err != nil {
		return err
	}
	// Bound into the sandbox once it runs; the host's clones go either way.
	defer func() {
		if derr := detach(); derr != nil {
			err = errors.Join(err, derr)
		}
	}()
	if len(spec.Mounts) > 0 {
		phases.mark("volumes")
	}
	if r.cfg.GVisor != nil {
		return r.createGVisor(ctx, spec, sp, phases)
	}
	var ns *userNS
	if pending != nil {
		ns, err = pending.take()
	} else {
		ns, err = newUserNS(ctx, sp.Linux.UIDMappings, sp.Linux.GIDMappings)
	}
	if err != nil {
		return err
	}
	// Once runc has made the sandbox's init, the namespace lives in it.
	defer ns.close()
	joinUserNS(sp, ns.path)
	netns := inheritNetNS(sp)
	rl := takeRlimits(sp)
	phases.mark("userns")
	if err := r.writeConfig(id, sp); err != nil {
		return err
	}
	phases.mark("config")
	return r.runcRun(ctx, spec, netns, rl, phases)
}

// phaseTimer collects how long each step of Create took, for the debug log.
type phaseTimer struct {
	last  time.Time
	attrs []any
}

func (p *phaseTimer) mark(name string) {
	now := time.Now()
	p.attrs = append(p.attrs, name, now.Sub(p.last))
	p.last = now
}

func (r *Runtime) validate(s runtime.Spec) error {
	if err := checkID(s.ID); err != nil {
		return err
	}
	bad := func(format string, a ...any) error {
		return fmt.Errorf("sandbox %s: %s: %w", s.ID, fmt.Sprintf(format, a...), errdefs.ErrInvalidArgument)
	}
	if len(s.Layers) == 0 {
		return bad("no rootfs layers")
	}
	for _, l := range s.Layers {
		if !filepath.IsAbs(l) {
			return bad("layer %q is not absolute", l)
		}
	}
	if s.DiskBytes < 1<<20 {
		return bad("disk size %d is under 1 MiB", s.DiskBytes)
	}
	if s.AgentPath == "" || !filepath.IsAbs(s.AgentPath) {
		return bad("agent path %q is not absolute", s.AgentPath)
	}
	if s.NetNSPath != "" && !filepath.IsAbs(s.NetNSPath) {
		return bad("netns path %q is not absolute", s.NetNSPath)
	}
	if err := r.checkMounts(s); err != nil {
		return fmt.Errorf("sandbox %s: %w", s.ID, err)
	}
	if s.RestoreImage != "" {
		if !r.CopiesMemory() {
			return fmt.Errorf("sandbox %s: start from a checkpoint image: %w", s.ID, errNoCopies)
		}
		if !filepath.IsAbs(s.RestoreImage) {
			return bad("checkpoint image path %q is not absolute", s.RestoreImage)
		}
		if _, err := os.Stat(filepath.Join(s.RestoreImage, "checkpoint.img")); err != nil {
			return fmt.Errorf("sandbox %s: no checkpoint image in %s: %w", s.ID, s.RestoreImage, errdefs.ErrNotFound)
		}
	}
	return nil
}

// prepareRootfs makes the disk image, mounts it and the overlay on top,
// for a sandbox whose root is host uid (and gid) uid.
func (r *Runtime) prepareRootfs(ctx context.Context, s runtime.Spec, uid uint32, phases *phaseTimer) error {
	for _, l := range s.Layers {
		if fi, err := os.Stat(l); err != nil || !fi.IsDir() {
			return fmt.Errorf("layer %q: not a directory: %w", l, errdefs.ErrInvalidArgument)
		}
	}
	if _, err := os.Stat(s.AgentPath); err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	id := s.ID
	phases.mark("checks")
	// The user namespace for the idmapped layers costs a fork (~10 ms)
	// the first time a uid slot is used: made while the disk image is
	// prepared, and always collected before returning.
	type nsResult struct {
		f   *os.File
		err error
	}
	nsc := make(chan nsResult, 1)
	go func() {
		f, err := r.idmaps.get(r.cfg.UIDBase, uid, r.cfg.UIDCount)
		nsc <- nsResult{f, err}
	}()
	defer func() {
		if nsc != nil {
			<-nsc
		}
	}()
	// A pooled image comes bound to its loop device already; closing it
	// once mounted leaves the device to the mount, and closing it after
	// a failure clears it.
	var dev *os.File
	took := false
	if r.pool != nil {
		dev, took = r.pool.take(s.DiskBytes, r.image(id))
	}
	if dev != nil {
		defer dev.Close()
	}
	if !took {
		if err := diskimg.Make(ctx, r.image(id), s.DiskBytes, diskimg.Format{}); err != nil {
			return err
		}
	}
	phases.mark("mkfs")
	disk, rootfs := r.diskDir(id), r.rootfs(id)
	for _, d := range []string{disk, rootfs} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return err
		}
	}
	// Scratch: see diskimg.Scratch, and SyncDisk for a pause.
	var err error
	if dev != nil {
		err = diskimg.MountLoop(dev, disk, diskimg.Scratch)
	} else {
		err = diskimg.Mount(r.image(id), disk, diskimg.Scratch)
	}
	if err != nil {
		return err
	}
	phases.mark("mount_disk")
	upper, work := filepath.Join(disk, "upper"), filepath.Join(disk, "work")
	for _, d := range []string{upper, work} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return err
		}
		if err := os.Chown(d, int(uid), int(uid)); err != nil {
			return err
		}
	}
	ns := <-nsc
	nsc = nil
	if ns.err != nil {
		return ns.err
	}
	lowers, err := mountIdmappedLayers(s.Layers, filepath.Join(r.dir(id), "lower"), ns.f)
	if err != nil {
		return err
	}
	phases.mark("idmap")
	// The root of the overlay takes the upper dir's mode: 0755 owned by
	// the sandbox's root.
	err = mountOverlay(lowers, upper, work, rootfs)
	if derr := detachLayers(lowers); err == nil {
		err = derr
	}
	if err != nil {
		return err
	}
	phases.mark("mount_overlay")
	err = r.writeIdentity(rootfs, s.Hostname, int(uid))
	phases.mark("identity")
	return err
}

// writeIdentity writes /etc/hostname and /etc/hosts into the sandbox's
// writable layer. Paths are resolved inside the rootfs (RESOLVE_IN_ROOT) so
// a symlink planted in a template layer cannot redirect the write onto the
// host.
func (r *Runtime) writeIdentity(rootfs, hostname string, uid int) error {
	if hostname == "" {
		return nil
	}
	root, err := os.Open(rootfs)
	if err != nil {
		return err
	}
	defer root.Close()
	rfd := int(root.Fd())
	if err := mkdirAllInRoot(rfd, "etc", uid); err != nil {
		return err
	}
	hosts := fmt.Sprintf("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\t%s\n", hostname)
	files := []struct{ name, body string }{
		{"etc/hostname", hostname + "\n"},
		{"etc/hosts", hosts},
	}
	for _, f := range files {
		if err := writeInRoot(rfd, f.name, []byte(f.body), uid, unix.O_NOFOLLOW); err != nil {
			return err
		}
	}
	return nil
}

func (r *Runtime) writeConfig(id string, sp *specs.Spec) error {
	b, err := json.MarshalIndent(sp, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(r.dir(id), "config.json"), b, 0o600)
}

// runcRun starts the container detached. Without a BeforeStart hook it is
// one `runc run --detach`; with one it is `runc create`, then the hook
// while the container's process starts (see start). The agent's stdout
// and stderr go to AgentLog; runc's own errors go to runc.log, whose tail
// is returned. runc runs inside the sandbox's network namespace netns, if
// it joins one, and under the sandbox's rlimits rl (see inheritNetNS and
// takeRlimits).
func (r *Runtime) runcRun(ctx context.Context, spec runtime.Spec, netns string, rl []specs.POSIXRlimit, phases *phaseTimer) error {
	id := spec.ID
	logf, err := os.OpenFile(r.AgentLog(id), os.O_WRONLY|os.O_CREATE|os.O_APPEND|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	secret, err := secretPipe(spec.AgentSecret)
	if err != nil {
		return err
	}
	// Descriptors runc hands the agent from 3 on: the secret's pipe, then
	// the workload cgroup's tasks files (workloadFDs).
	var files []*os.File
	if secret != nil {
		defer secret.Close()
		files = append(files, secret)
	}
	if r.workloadPids(spec) {
		work, root, err := r.workloadTasks(id, spec.PidsLimit)
		if err != nil {
			return err
		}
		defer work.Close()
		defer root.Close()
		files = append(files, work, root)
	}
	var extra []string
	if len(files) > 0 {
		extra = []string{"--preserve-fds", strconv.Itoa(len(files))}
	}
	if spec.BeforeStart == nil {
		cmd := r.command(ctx, id, append(append([]string{"run", "--detach", "--no-new-keyring"}, extra...), "--bundle", r.dir(id), id)...)
		cmd.Stdout, cmd.Stderr = logf, logf
		cmd.ExtraFiles = files
		if err := runIn(netns, rl, cmd); err != nil {
			return fmt.Errorf("runc run: %w%s", err, r.logTail(id))
		}
		phases.mark("runc_run")
		return nil
	}
	// The pid file saves a `runc state` round trip (~20 ms).
	pidFile := filepath.Join(r.dir(id), "init.pid")
	cmd := r.command(ctx, id, append(append([]string{"create", "--no-new-keyring"}, extra...), "--bundle", r.dir(id), "--pid-file", pidFile, id)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.ExtraFiles = files
	if err := runIn(netns, rl, cmd); err != nil {
		return fmt.Errorf("runc create: %w%s", err, r.logTail(id))
	}
	phases.mark("runc_create")
	b, err := os.ReadFile(pidFile)
	if err != nil {
		return fmt.Errorf("read init pid: %w", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return fmt.Errorf("init pid file holds %q", b)
	}
	// The agent starts while the hook wires the sandbox's network: the
	// agent needs no network to start (it listens on every address, and
	// the daemon reaches it only through what the hook wires), its Go
	// start is the longer of the two, and no process but the agent runs
	// in the sandbox before the daemon asks for one.
	hooked := make(chan error, 1)
	go func() { hooked <- spec.BeforeStart(ctx, pid) }()
	serr := r.start(ctx, id, pid)
	herr := <-hooked
	phases.mark("start_and_before_start")
	if serr != nil {
		// An init that died takes its namespaces along: the hook's
		// error, if any, follows from this one.
		return serr
	}
	if herr != nil {
		// An agent that exits at once (a broken one) takes its
		// namespaces along while the hook wires them: its exit is the
		// failure to report, with its last words.
		if r.initExitsWithin(ctx, id, initExitGrace) {
			words := ""
			if tail := r.AgentLogTail(id); tail != "" {
				words = "; the agent's last words: " + tail
			}
			return fmt.Errorf("%w%s: %w", runtime.ErrInitExited, words, errdefs.ErrUnavailable)
		}
		return fmt.Errorf("before start: %w", herr)
	}
	return nil
}

// initExitGrace bounds how long a create whose BeforeStart hook failed
// waits to see whether the sandbox's init is exiting.
const initExitGrace = 2 * time.Second

// initExitsWithin reports whether sandbox id's init has exited, or does
// within grace (InitExited).
func (r *Runtime) initExitsWithin(ctx context.Context, id string, grace time.Duration) bool {
	return runtime.ExitsWithin(ctx, grace, func(ctx context.Context) (<-chan struct{}, error) { return r.InitExited(ctx, id) })
}

// secretFD is the descriptor the agent finds its secret's pipe on
// (runtime.Secret): runc hands a container the descriptors from 3 on that
// it was started with (--preserve-fds), and a runsc with --pass-fd is
// told to hand its descriptor 3 over as 3. 0 under an older runsc, which
// has no such hand-over: the secret goes into the environment.
func (r *Runtime) secretFD() int {
	if g := r.cfg.GVisor; g != nil && !g.PassFD {
		return 0
	}
	return 3
}

// secretPipe is the read end of a pipe that holds s's value, for runc to
// hand the agent (runcRun, withSecret); nil when s has no name. The value is
// written and the write end closed before it returns: a pipe holds at
// least a page, and a secret is a few dozen bytes.
func secretPipe(s runtime.Secret) (*os.File, error) {
	if s.Name == "" {
		return nil, nil
	}
	if len(s.Value) > 4096 {
		return nil, fmt.Errorf("agent secret %s: %d bytes, more than a pipe is sure to hold", s.Name, len(s.Value))
	}
	rd, wr, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("agent secret %s: %w", s.Name, err)
	}
	_, err = wr.WriteString(s.Value)
	if cerr := wr.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		rd.Close()
		return nil, fmt.Errorf("agent secret %s: %w", s.Name, err)
	}
	return rd, nil
}

// withSecret makes secret's pipe descriptor 3 of cmd (runsc, which hands
// it to the sandbox with --pass-fd 3:3; runcRun hands runc its
// descriptors itself).
func withSecret(cmd *exec.Cmd, secret *os.File) {
	if secret != nil {
		cmd.ExtraFiles = []*os.File{secret}
	}
}

// logTail returns the last lines of the sandbox's runc log (and, under
// gVisor, the sentry's crash report, which says what went wrong), for
// errors.
func (r *Runtime) logTail(id string) string {
	if report := r.CrashReport(id); report != "" {
		return ": " + report
	}
	if tail := fileTail(r.runcLog(id), 2048, false); tail != "" {
		return ": " + tail
	}
	return ""
}

// runcState is the part of `runc state` output we use.
type runcState struct {
	ID     string `json:"id"`
	Pid    int    `json:"pid"`
	Status string `json:"status"`
}

// stateTimeout bounds one `runc state`, which reads runc's state file and
// asks no process: it is a guard, not a wait. (gVisor sandboxes are
// inspected by runscState, whose `runsc state` gets askTimeout.)
const stateTimeout = 30 * time.Second

// state reports id as the runtime's `state` command would; ok is false
// when the runtime has no record of it. Under gVisor it reads runsc's
// state file first (runscState) and may fail with errUnresponsive.
func (r *Runtime) state(ctx context.Context, id string) (st runcState, ok bool, err error) {
	return r.stateKept(ctx, id, 0)
}

// stateKept is state, which under gVisor may answer from a `runsc state`
// up to keep old (runscState).
func (r *Runtime) stateKept(ctx context.Context, id string, keep time.Duration) (st runcState, ok bool, err error) {
	if !r.hasState(id) {
		return st, false, nil
	}
	if r.cfg.GVisor != nil {
		return r.runscState(ctx, id, r.askState, keep)
	}
	if st, settled := r.runcStateFromFile(id); settled {
		return st, true, nil
	}
	ctx, cancel := context.WithTimeout(ctx, stateTimeout)
	defer cancel()
	return r.askState(ctx, id)
}

// askState runs the runtime's `state` command on id.
func (r *Runtime) askState(ctx context.Context, id string) (st runcState, ok bool, err error) {
	out, err := r.runcOutput(ctx, "state", id)
	if err != nil {
		if strings.Contains(err.Error(), "does not exist") {
			return st, false, nil
		}
		return st, false, err
	}
	if err := json.Unmarshal(out, &st); err != nil {
		return st, false, fmt.Errorf("runc state: %w", err)
	}
	return st, true, nil
}

// Inspect reports the sandbox's status and its init's host pid. The
// monitor inspects every sandbox once a second: under gVisor, a live
// sandbox's status may come from a `runsc state` up to runscAnswerTTL old.
func (r *Runtime) Inspect(ctx context.Context, id string) (runtime.State, error) {
	if err := checkID(id); err != nil {
		return runtime.State{}, err
	}
	st, ok, err := r.stateKept(ctx, id, runscAnswerTTL)
	if err != nil {
		return runtime.State{}, fmt.Errorf("inspect sandbox %s: %w", id, err)
	}
	if ok {
		s := runtime.State{ID: id, Pid: st.Pid}
		switch st.Status {
		case "created":
			s.Status = runtime.StatusCreated
		case "running":
			s.Status = runtime.StatusRunning
		case "paused":
			s.Status = runtime.StatusPaused
		case "stopped":
			s.Status, s.Pid = runtime.StatusStopped, 0
		default:
			s.Status = runtime.StatusUnknown
		}
		return s, nil
	}
	// Leftovers without a container (a half-made or half-destroyed
	// sandbox) are reported as stopped so the caller destroys them.
	if _, err := os.Stat(r.dir(id)); err == nil {
		return runtime.State{ID: id, Status: runtime.StatusStopped}, nil
	}
	if mps, _ := diskimg.MountsUnder(r.dir(id)); len(mps) > 0 {
		return runtime.State{ID: id, Status: runtime.StatusStopped}, nil
	}
	return runtime.State{}, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
}

// List returns every sandbox ID with anything left on this host: runc
// state, a state directory or a mount under StateDir.
func (r *Runtime) List(ctx context.Context) ([]string, error) {
	seen := map[string]bool{}
	held, err := r.stateIDs()
	if err != nil {
		return nil, fmt.Errorf("list sandboxes: %w", err)
	}
	for _, id := range held {
		seen[id] = true
	}
	ents, err := os.ReadDir(r.cfg.StateDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("list sandboxes: %w", err)
	}
	for _, e := range ents {
		if e.IsDir() && validID(e.Name()) {
			seen[e.Name()] = true
		}
	}
	mps, err := diskimg.MountsUnder(r.cfg.StateDir)
	if err != nil {
		return nil, fmt.Errorf("list sandboxes: %w", err)
	}
	for _, mp := range mps {
		rel, err := filepath.Rel(r.cfg.StateDir, mp)
		if err != nil || rel == "." {
			continue
		}
		if id := strings.SplitN(rel, "/", 2)[0]; validID(id) {
			seen[id] = true
		}
	}
	ids := make([]string, 0, len(seen))
	for id := range seen {
		ids = append(ids, id)
	}
	return ids, nil
}

// Pause freezes every process of the sandbox. runc gives up on a freezer
// that has not frozen after its own retries ("unable to freeze"), which
// a host whose cores are all busy makes likely: the sandbox's tasks are
// not scheduled in time to stop in the freezer. runc thaws the cgroup
// when it gives up, so the freeze is tried again, freezeAttempts times
// in all, a little longer apart each time.
func (r *Runtime) Pause(ctx context.Context, id string) error {
	var err error
	for attempt := 1; ; attempt++ {
		err = r.simple(ctx, id, "pause")
		if err == nil || !strings.Contains(err.Error(), "unable to freeze") || attempt == freezeAttempts {
			return err
		}
		r.log.Debug("freeze_again", "sandbox_id", id, "attempt", attempt, "err", err)
		select {
		case <-ctx.Done():
			return err
		case <-time.After(time.Duration(attempt) * 20 * time.Millisecond):
		}
	}
}

// freezeAttempts bounds Pause's tries of runc's freeze.
const freezeAttempts = 5

// Resume thaws a paused sandbox.
func (r *Runtime) Resume(ctx context.Context, id string) error {
	return r.simple(ctx, id, "resume")
}

func (r *Runtime) simple(ctx context.Context, id, verb string) error {
	if err := checkID(id); err != nil {
		return err
	}
	if _, ok, err := r.state(ctx, id); err != nil {
		return fmt.Errorf("%s sandbox %s: %w", verb, id, err)
	} else if !ok {
		return fmt.Errorf("%s sandbox %s: %w", verb, id, errdefs.ErrNotFound)
	}
	if _, err := r.runcOutput(ctx, verb, id); err != nil {
		return fmt.Errorf("%s sandbox %s: %w: %w", verb, id, err, errdefs.ErrFailedPrecondition)
	}
	return nil
}
