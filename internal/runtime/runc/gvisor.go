package runc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/runtime"
	"github.com/berth-sandbox/berth/proto/envd"
)

// gVisor's runsc speaks runc's command line (create, start, state, kill,
// delete, pause, resume, exec), so a gVisor sandbox is driven by this
// package with a handful of differences, all in this file and all keyed on
// Config.GVisor:
//
//   - Root filesystem: the same disk image, idmapped layers and overlay as
//     a runc sandbox. runsc's gofer serves it to the sentry; --overlay2=none
//     keeps writes on the disk image (runsc's own overlay would put them in
//     sentry memory, outside the disk limit).
//   - Users: the spec keeps a user namespace with the sandbox's slot
//     mappings but no path: runsc runs the gofer in a user namespace of its
//     own with those mappings, as the slot's root uid on the host (never
//     host root), and the sentry as nobody (65534) in another one. The
//     daemon-made namespace runc joins (userns.go) is not used.
//   - Network: --network=sandbox. The sentry's netstack takes over the
//     interfaces of the network namespace it joins, so the host-side veth,
//     nftables, proxy and DNS filter see the same traffic as with runc.
//     runsc reads the namespace's links when it creates the sandbox, so a
//     BeforeStart hook runs before `runsc run`, on a namespace held by a
//     short-lived process (netHolder) that the sandbox then joins.
//   - /sys is gVisor's own sysfs; the host's /sys is never bound in.
//   - rlimits and seccomp stay in the spec: the sentry applies both to the
//     sandbox's processes (--oci-seccomp), so the deny list is the same one
//     a runc sandbox gets.
//   - Stats: the host cgroup holds the sentry and the gofer, so memory and
//     task counts come from `runsc events --stats` (the sandbox's own
//     processes and their memory) instead; CPU time stays the cgroup's (what
//     the sandbox costs the host).

// GVisor configures gVisor mode.
type GVisor struct {
	// Platform is runsc's --platform: "ptrace", "systrap" or "kvm".
	Platform string
	// HideNetSysctl runs `runsc run` and `runsc restore` with the host's
	// /proc/sys/net hidden (see netSysctlShim): runsc releases before
	// 2024-08 tell the host's network namespace from others by whether
	// /proc/sys/net/core/rmem_default exists, which on Linux 6.x it does in
	// every namespace, so they refuse every sandbox network.
	HideNetSysctl bool
	// AllowSUID says this runsc has --allow-suid (releases from 2024 on;
	// Debian's 20221219 has not): without it the sentry ignores the
	// set-user-ID bit whatever no_new_privs says. A sandbox with
	// runtime.Spec.AllowSetuid then gets the flag and no no_new_privs;
	// every other sandbox gets neither, so its sentry honours no
	// set-user-ID bit at all.
	AllowSUID bool
	// ResumeBeforeDelete thaws a paused sandbox (`runsc resume`) before
	// `runsc delete`, which in old releases (Debian's 2022 one) panics
	// on the paused => stopped transition; newer ones let every state
	// go to stopped. Only a sandbox whose sentry survived the cgroup kill
	// gets a delete at all (endProcesses).
	ResumeBeforeDelete bool
	// RestoreCopies says this runsc can restore one sandbox's checkpoint
	// into another (runtime.Spec.RestoreImage): it checkpoints a running
	// sandbox without stopping it (--leave-running) and it can be told to
	// only warn about the spec differences a copy has
	// (--restore-spec-validation; a copy has its own uid range, which
	// releases with that flag refuse by default). Debian's 20221219
	// release has not the flag; its sandboxes are copied by their files
	// only.
	RestoreCopies bool
	// BackgroundRestore says this runsc has `restore --background` and
	// `checkpoint --compression`: checkpoints are written uncompressed
	// (--compression=none) and restored with --background, so `runsc
	// restore` returns once the sentry's kernel state is loaded and the
	// sandbox runs while the sentry reads its memory pages in (a page
	// touched before it is in waits for it). The sentry holds the image
	// files open from `runsc restore` on (they are passed to it as file
	// descriptors), so the image directory may be removed once Restore
	// returns. Debian's 20221219 has neither flag.
	BackgroundRestore bool
	// DirectImageIO says this runsc has --direct on `checkpoint` and
	// `restore`: the sentry then writes and reads the image's memory
	// pages with O_DIRECT, where the image's file system takes it
	// (checkpointArgs, restoreArgs). Through the page cache, a restore
	// copies every page from the cache into the sentry's memory, one
	// page fault per 4 KiB page, and a checkpoint leaves the image's
	// pages dirty in the cache, where they hold the host's memory the
	// pause meant to free until they are written back; direct, the disk
	// reads into the sentry's memory itself and a paused sandbox's
	// memory is on disk, not in the host's RAM. Measured in the README
	// (Performance, "Checkpoint images with O_DIRECT").
	DirectImageIO bool
	// PassFD says this runsc's `run` has --pass-fd (host descriptor M
	// becomes the sandbox's first process's descriptor N; releases from
	// 2023 on, Debian's 20221219 has not): the agent's secret then comes
	// through a pipe as under runc (runtime.Secret), and the agent starts
	// once instead of executing itself again to drop it from its
	// environment.
	PassFD bool
	// PrepareRestore says this runsc's `restore` restores into a
	// container `runsc create` made beforehand (PrepareRestore), as
	// releases with `restore --background` (2024 on) do; Debian's
	// 20221219 refuses ("container already exists").
	PrepareRestore bool
	// MountsGap, when set, says why this runsc cannot bind volumes
	// (runtime.Spec.Mounts): a create with mounts is refused with it.
	MountsGap string
}

// checkpointArgs are the `runsc checkpoint` flags for an image written
// into dir, besides its path. (--exclude-committed-zero-pages is left out:
// it makes the sentry read every committed page to find zero ones, which
// upstream warns slows a save; a 256 MiB holder had 7 % zero pages.)
func (g *GVisor) checkpointArgs(dir string) []string {
	var args []string
	if g.BackgroundRestore {
		// A compressed image is loaded whole before the restore
		// returns, whatever --background says.
		args = append(args, "--compression=none")
	}
	if g.DirectImageIO && directWrites(dir) {
		args = append(args, "--direct")
	}
	return args
}

// restoreArgs are the `runsc restore` flags for the image in dir, besides
// its path. An image written without --direct (an older daemon's, or
// one imported) is read with it all the same: the flag is about how the
// file is read, not how it was laid out.
func (g *GVisor) restoreArgs(dir string) []string {
	var args []string
	if g.BackgroundRestore {
		args = append(args, "--background")
	}
	if g.DirectImageIO && directReads(dir) {
		args = append(args, "--direct")
	}
	return args
}

// directProbe is the file directWrites makes and removes in an image
// directory.
const directProbe = ".berth-direct-probe"

// directWrites reports whether a file made in dir can be written with
// O_DIRECT, which some file systems refuse (tmpfs before Linux 6.6, some
// FUSE ones): a probe file is opened with it and removed. runsc, told
// --direct on such a file system, fails the checkpoint.
func directWrites(dir string) bool {
	p := filepath.Join(dir, directProbe)
	f, err := os.OpenFile(p, os.O_CREATE|os.O_TRUNC|os.O_WRONLY|unix.O_DIRECT|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return false
	}
	_ = f.Close()
	return os.Remove(p) == nil
}

// directReads reports whether the image in dir can be read with O_DIRECT:
// its first regular file opens with it (the image's files share dir's
// file system).
func directReads(dir string) bool {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return false
	}
	for _, e := range ents {
		if !e.Type().IsRegular() {
			continue
		}
		f, err := os.OpenFile(filepath.Join(dir, e.Name()), os.O_RDONLY|unix.O_DIRECT|unix.O_NOFOLLOW, 0)
		if err != nil {
			return false
		}
		_ = f.Close()
		return true
	}
	return false
}

// raisesSetuid reports whether sandbox spec runs with set-user-ID programs
// honoured: it asks for it and this runsc can.
func (r *Runtime) raisesSetuid(spec runtime.Spec) bool {
	return spec.AllowSetuid && r.cfg.GVisor != nil && r.cfg.GVisor.AllowSUID
}

// gvisorFlags are the global runsc flags every invocation carries: runsc
// keeps no per-container copy of most of them.
func (r *Runtime) gvisorFlags() []string {
	if r.cfg.GVisor == nil {
		return nil
	}
	return []string{
		"--platform=" + r.cfg.GVisor.Platform,
		"--network=sandbox",
		"--overlay2=none",
		"--oci-seccomp",
		// The sandbox sees as many CPUs as its quota gives it, as
		// runtimes inside size their thread pools by it.
		"--cpu-num-from-quota",
	}
}

// agentMountCalls are the calls the agent's pids cgroup set-up makes that
// the seccomp profile denies (runtime.Spec.AgentPids).
var agentMountCalls = []string{"mount", "umount", "umount2"}

// allowAgentMount returns a copy of profile without agentMountCalls.
func allowAgentMount(profile *specs.LinuxSeccomp) *specs.LinuxSeccomp {
	if profile == nil {
		return nil
	}
	out := *profile
	out.Syscalls = nil
	for _, sc := range profile.Syscalls {
		sc.Names = slices.DeleteFunc(slices.Clone(sc.Names), func(n string) bool { return slices.Contains(agentMountCalls, n) })
		if len(sc.Names) > 0 {
			out.Syscalls = append(out.Syscalls, sc)
		}
	}
	return &out
}

// sentryTasks is the headroom a gVisor sandbox's host pids cgroup gets
// for the sentry's and gofer's own threads.
const sentryTasks = 128

// sentryPidsLimit is the host pids limit of a gVisor sandbox whose own
// tasks are limited to limit. The host cgroup holds the sentry, the gofer
// and, on the ptrace platform, the stub processes: one per address space
// the sandbox ever had at once (they are pooled, never killed), each with
// a thread per sentry thread that ran it. So each sandbox task costs the
// host ten and more tasks (64 sleeps: 698 host tasks), and a sentry that
// cannot make a stub thread dies. This wall is the host's protection;
// the sandbox's own limit, held inside by the agent
// (internal/agent/pids.go), is what a fork bomb should meet first, which
// at small limits it does and at large ones it may not (docs/security.md,
// gVisor).
func sentryPidsLimit(limit int64) int64 {
	return limitTimesStubs*limit + 2*sentryTasks
}

// limitTimesStubs is how many host tasks a gVisor sandbox's host cgroup
// allows per task of the sandbox's own limit (sentryPidsLimit): room for
// a bomb at a limit of 64 to be killed inside before the host wall (peak
// 874 of 1,280 measured).
const limitTimesStubs = 16

// gvisorSpec adapts a runc sandbox's OCI config to runsc (see the top of
// this file). netns is the namespace to join, "" for a new one; setuid
// says the sentry honours set-user-ID programs (Runtime.raisesSetuid).
func gvisorSpec(sp *specs.Spec, spec runtime.Spec, netns string, setuid bool) {
	for i, n := range sp.Linux.Namespaces {
		if n.Type == specs.NetworkNamespace {
			sp.Linux.Namespaces[i].Path = netns
		}
	}
	kept := sp.Mounts[:0]
	for _, m := range sp.Mounts {
		switch m.Destination {
		case "/sys":
			m = specs.Mount{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}}
		case "/sys/fs/cgroup":
			// gVisor's cgroupfs is its own emulation; the sandbox's
			// limits are the host cgroup's, which it would not show.
			continue
		}
		kept = append(kept, m)
	}
	sp.Mounts = kept
	// The host pids cgroup counts gVisor's own tasks besides the
	// sandbox's: the sentry's and gofer's threads, and on the ptrace
	// platform one stub task per sandbox thread. At the bare sandbox
	// limit the sentry could not start a stub for the sandbox's second
	// Go program ("error initializing first thread: resource temporarily
	// unavailable") and died. The cgroup gets headroom for gVisor itself;
	// a sandbox that forks through all of it still takes its sentry down
	// (docs/security.md, gVisor, pids limit gap).
	// Computed from the sandbox's own limit, never from the config's
	// current value: a restore adapts the config.json this already
	// adapted, and each pass would multiply the wall again (until the
	// kernel refuses pids.max).
	if p := sp.Linux.Resources.Pids; p != nil && spec.PidsLimit > 0 {
		p.Limit = ptr(sentryPidsLimit(spec.PidsLimit))
	}
	if spec.AgentPids {
		// The sentry's CAP_SYS_ADMIN, not the host's: the agent mounts
		// the sentry's pids cgroup with it and drops it before serving
		// (runtime.Spec.AgentPids).
		c := sp.Process.Capabilities
		c.Bounding = withCap(c.Bounding, "CAP_SYS_ADMIN")
		c.Effective = withCap(c.Effective, "CAP_SYS_ADMIN")
		c.Permitted = withCap(c.Permitted, "CAP_SYS_ADMIN")
		// The sentry applies the profile to the agent too: its mount and
		// detach must pass. The agent denies the same calls to itself
		// and to every process it starts right after (agent.Deny).
		sp.Linux.Seccomp = allowAgentMount(sp.Linux.Seccomp)
	}
	// no_new_privs unless set-user-ID programs are to raise: a runsc
	// without --allow-suid never raises them (Spec.AllowSetuid has no
	// effect there), so its sandboxes all keep it. Without it the agent
	// still installs its own filter (agent.Deny) while it holds
	// the sentry's CAP_SYS_ADMIN, which the kernel then requires instead.
	sp.Process.NoNewPrivileges = !setuid
	// Host paths: meaningless inside the sentry, which shows none of them.
	sp.Linux.MaskedPaths = nil
	sp.Linux.ReadonlyPaths = nil
}

// withCap is set plus name, once (gvisorSpec may adapt a config twice).
func withCap(set []string, name string) []string {
	if slices.Contains(set, name) {
		return set
	}
	return append(slices.Clone(set), name)
}

// diskTmp keeps a gVisor sandbox's /tmp on its disk, as under runc. runsc
// mounts a tmpfs in the sentry's memory over an empty /tmp that the config
// mounts nothing on, so files written there would count against the
// sandbox's memory (a big one ending the sandbox whole) instead of its
// disk, show in no disk usage, and be missing from a filesystem snapshot
// or fork. An explicit bind of the root's own /tmp turns that off. Only
// at create: a restore reuses the config its sandbox was created with
// (runsc checks that the mounts match the checkpoint's), so one made
// before this keeps its tmpfs.
func diskTmp(sp *specs.Spec) {
	if sp.Root == nil {
		return
	}
	for _, m := range sp.Mounts {
		if filepath.Clean(m.Destination) == "/tmp" {
			return
		}
	}
	src := filepath.Join(sp.Root.Path, "tmp")
	// Lstat: a root whose /tmp is a symlink (or missing) keeps runsc's
	// default rather than a bind that would follow it out of the root.
	if fi, err := os.Lstat(src); err != nil || !fi.IsDir() {
		return
	}
	// Before any mount under /tmp (a volume there), which it would hide.
	at := len(sp.Mounts)
	for i, m := range sp.Mounts {
		if strings.HasPrefix(filepath.Clean(m.Destination), "/tmp/") {
			at = i
			break
		}
	}
	sp.Mounts = slices.Insert(sp.Mounts, at, specs.Mount{Destination: "/tmp", Type: "bind", Source: src, Options: []string{"rbind", "rw"}})
}

// agentErrnoCalls hands the seccomp profile's rules that answer an errno
// other than EPERM to the agent. runsc's OCI seccomp answers every
// SCMP_ACT_ERRNO rule with EPERM, whatever errno the rule names, and
// callers that fall back on ENOSYS then fail instead: glibc's
// pthread_create tries clone3 and falls back to clone only on ENOSYS, so
// no glibc program could start a thread (python's threading, curl's
// resolver, node). Such rules (unconditional ones: clone3 and the AIO
// calls) leave the profile, and the agent installs them with their own
// errno through the sentry's seccomp, which returns what a filter says,
// for itself and everything it starts (envd.ErrnoCallsEnv,
// agent.Deny). Only at create, as diskTmp: runsc checks that a
// restore's seccomp matches the checkpoint's.
func agentErrnoCalls(sp *specs.Spec) {
	if sp.Linux == nil || sp.Linux.Seccomp == nil || sp.Process == nil {
		return
	}
	var moved []string
	kept := sp.Linux.Seccomp.Syscalls[:0]
	for _, rule := range sp.Linux.Seccomp.Syscalls {
		if rule.Action != specs.ActErrno || rule.ErrnoRet == nil || *rule.ErrnoRet == errnoEPERM || len(rule.Args) > 0 {
			kept = append(kept, rule)
			continue
		}
		for _, name := range rule.Names {
			moved = append(moved, fmt.Sprintf("%s:%d", name, *rule.ErrnoRet))
		}
	}
	sp.Linux.Seccomp.Syscalls = kept
	if len(moved) == 0 {
		return
	}
	env := slices.DeleteFunc(sp.Process.Env, func(e string) bool { return strings.HasPrefix(e, envd.ErrnoCallsEnv+"=") })
	sp.Process.Env = append(env, envd.ErrnoCallsEnv+"="+strings.Join(moved, ","))
}

// createGVisor starts a prepared gVisor sandbox: the config is written,
// the network namespace wired, then one `runsc run --detach`.
func (r *Runtime) createGVisor(ctx context.Context, spec runtime.Spec, sp *specs.Spec, phases *phaseTimer) error {
	id := spec.ID
	if err := r.checkPrefixFree(id); err != nil {
		return err
	}
	netns, done, err := sandboxNetNS(ctx, spec)
	if err != nil {
		return err
	}
	defer done()
	phases.mark("before_start")
	gvisorSpec(sp, spec, netns, r.raisesSetuid(spec))
	diskTmp(sp)
	agentErrnoCalls(sp)
	if err := r.writeConfig(id, sp); err != nil {
		return err
	}
	phases.mark("config")
	if spec.RestoreImage != "" {
		flags, err := r.restoreFlags(id, spec.RestoreImage)
		if err != nil {
			return err
		}
		if err := r.runscRestore(ctx, spec, sp, append(flags, "--image-path", spec.RestoreImage)...); err != nil {
			return err
		}
		phases.mark("runsc_restore")
		return nil
	}
	args := []string{"--detach"}
	var secret *os.File
	if r.secretFD() > 0 {
		if secret, err = secretPipe(spec.AgentSecret); err != nil {
			return err
		}
		if secret != nil {
			defer secret.Close()
			// The pipe is runsc's descriptor 3 (withSecret) and the
			// agent's secretFD.
			args = append(args, "--pass-fd", "3:"+strconv.Itoa(r.secretFD()))
		}
	}
	if err := r.runscStart(ctx, spec, "run", secret, args...); err != nil {
		return err
	}
	phases.mark("runsc_run")
	return nil
}

// sandboxNetNS returns the path of the network namespace a gVisor
// sandbox joins, valid until done is called. runsc's sandbox network
// needs a namespace path: an empty one makes it use runsc's own
// namespace, which it refuses. So a spec without NetNSPath gets a new
// namespace, held by a netHolder until the sandbox has joined it, and a
// spec with a BeforeStart hook gets it called with the holder's pid
// (only its /proc/<pid>/ns/net is meaningful to the hook).
func sandboxNetNS(ctx context.Context, spec runtime.Spec) (path string, done func(), err error) {
	if spec.NetNSPath != "" && spec.BeforeStart == nil {
		if err := checkNotHostNetNS(spec.NetNSPath); err != nil {
			return "", nil, err
		}
		return spec.NetNSPath, func() {}, nil
	}
	h, err := newNetHolder(ctx, spec.NetNSPath)
	if err != nil {
		return "", nil, err
	}
	if err := checkNotHostNetNS(h.path()); err != nil {
		h.close()
		return "", nil, err
	}
	if spec.BeforeStart != nil {
		if err := spec.BeforeStart(ctx, h.pid()); err != nil {
			h.close()
			return "", nil, fmt.Errorf("before start: %w", err)
		}
	}
	return h.path(), h.close, nil
}

// checkPrefixFree refuses an id that is a prefix of another sandbox's
// under this runsc root, or has one as its prefix: runsc looks containers
// up by id prefix and then calls an exact id ambiguous ("bench1" vs
// "bench11"), so such a pair could not be deleted. The Manager's ids are
// all the same length, which never trips this.
func (r *Runtime) checkPrefixFree(id string) error {
	ids, err := r.stateIDs()
	if err != nil {
		return err
	}
	for _, other := range ids {
		if other != id && (strings.HasPrefix(other, id) || strings.HasPrefix(id, other)) {
			return fmt.Errorf("id %q and existing sandbox %q are prefixes of one another, which runsc cannot tell apart: %w", id, other, errdefs.ErrAlreadyExists)
		}
	}
	return nil
}

// runscStart runs `runsc <verb> <args...> --bundle <dir> <id>` with the
// agent's output going to AgentLog, and secret, when not nil, as runsc's
// descriptor 3.
func (r *Runtime) runscStart(ctx context.Context, spec runtime.Spec, verb string, secret *os.File, args ...string) error {
	id := spec.ID
	logf, err := os.OpenFile(r.AgentLog(id), os.O_WRONLY|os.O_CREATE|os.O_APPEND|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	var argv []string
	if r.raisesSetuid(spec) {
		// A global flag the sandbox's kernel takes at boot (and keeps
		// across a checkpoint); the later commands need not repeat it.
		argv = append(argv, "--allow-suid")
	}
	if spec.RestoreImage != "" {
		// A copy differs from the sandbox its image came from in what
		// must differ (uid range, network namespace, hostname, cgroup):
		// runsc then warns instead of refusing.
		argv = append(argv, "--restore-spec-validation=warning")
	}
	argv = append(append(argv, verb), args...)
	argv = append(argv, "--bundle", r.dir(id), id)
	cmd := r.command(ctx, id, argv...)
	cmd.Stdout, cmd.Stderr = logf, logf
	withSecret(cmd, secret)
	if r.cfg.GVisor.HideNetSysctl {
		if err := netSysctlShim(cmd, filepath.Join(r.dir(id), "shim")); err != nil {
			return err
		}
	}
	if err := runPinned(cmd, ""); err != nil {
		return fmt.Errorf("runsc %s: %w%s", verb, err, r.logTail(id))
	}
	return nil
}

// netSysctlShim makes cmd run in a mount namespace of its own whose root
// is a recursive bind of the host's, pivoted into, with a read-only empty
// tmpfs over /proc/sys/net. An old runsc's "am I in the host's network
// namespace" probe (does /proc/sys/net/core/rmem_default exist?) then
// answers no. Why so roundabout:
//
//   - Covering /proc/sys/net in place makes the namespace's only proc
//     mount "not fully visible", and the kernel then refuses the gofer's
//     proc mount in its user namespace (mount_too_revealing). The pivot
//     keeps the untouched original proc mount in the namespace (under the
//     old root), which satisfies that check.
//   - chroot instead of pivot_root would make the gofer's user namespace
//     fail: a chrooted process may not create one.
//
// The old root ends up at dir's path inside the new root (dir is an empty
// directory of the sandbox's own). Nothing propagates back to the host
// (private propagation), and the namespace dies with runsc's command.
// Berth itself makes sure the sandbox's namespace is not the host's
// (checkNotHostNetNS) before runsc runs, so the probe's protection is kept.
func netSysctlShim(cmd *exec.Cmd, dir string) error {
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		return fmt.Errorf("runsc netns shim: %w", err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("runsc netns shim: %w", err)
	}
	const script = `set -e
root=$1; shift
mount --rbind / "$root"
mount -t tmpfs -o ro,size=4k,mode=555 berth-runsc-shim "$root/proc/sys/net"
cd "$root"
pivot_root . ".$root"
cd /
exec "$@"`
	cmd.Args = append([]string{unshare, "--mount", "--propagation", "private", "--", "/bin/sh", "-c", script, "berth-runsc-shim", dir}, cmd.Args...)
	cmd.Path = unshare
	return nil
}

// checkNotHostNetNS fails if path is the daemon's (the host's) network namespace: a
// gVisor sandbox there would take over the host's interfaces.
func checkNotHostNetNS(path string) error {
	var host, ns unix.Stat_t
	if err := unix.Stat("/proc/self/ns/net", &host); err != nil {
		return fmt.Errorf("host netns: %w", err)
	}
	if err := unix.Stat(path, &ns); err != nil {
		return fmt.Errorf("netns %s: %w", path, err)
	}
	if host.Dev == ns.Dev && host.Ino == ns.Ino {
		return fmt.Errorf("netns %s is the host's", path)
	}
	return nil
}

// netHolder is a process that sits in a network namespace until the
// sandbox has joined it: a new one, or the one at a given path.
type netHolder struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
}

// newNetHolder starts cat(1) in a new network namespace (join == "") or
// in the one at join, and returns once it runs there.
func newNetHolder(ctx context.Context, join string) (*netHolder, error) {
	cat, err := exec.LookPath("cat")
	if err != nil {
		return nil, fmt.Errorf("netns holder: %w", err)
	}
	cmd := exec.Command(cat)
	cmd.Env = []string{}
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if join == "" {
		cmd.SysProcAttr.Cloneflags = syscall.CLONE_NEWNET
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if join == "" {
		err = cmd.Start()
	} else {
		err = startInNetNS(join, cmd)
	}
	if err != nil {
		return nil, fmt.Errorf("netns holder: %w", err)
	}
	h := &netHolder{cmd: cmd, stdin: stdin}
	if err := awaitEcho(ctx, stdin, stdout); err != nil {
		h.close()
		return nil, fmt.Errorf("netns holder: %w", err)
	}
	return h, nil
}

func (h *netHolder) pid() int     { return h.cmd.Process.Pid }
func (h *netHolder) path() string { return fmt.Sprintf("/proc/%d/ns/net", h.cmd.Process.Pid) }

func (h *netHolder) close() {
	h.stdin.Close()
	_ = h.cmd.Process.Kill() // gone already is fine
	_ = h.cmd.Wait()         // it was killed: the error says so
}

// runscStateFiles are runsc's state files of container id under its root:
// "<id>_sandbox:<sandbox id>.state" and ".lock".
func (r *Runtime) runscStateFiles(id string) []string {
	m, _ := filepath.Glob(filepath.Join(r.cfg.RuncRoot, id+"_sandbox:*"))
	return m
}

// hasState reports whether the runtime holds state for id.
func (r *Runtime) hasState(id string) bool {
	if r.cfg.GVisor != nil {
		return len(r.runscStateFiles(id)) > 0
	}
	return exists(filepath.Join(r.cfg.RuncRoot, id))
}

// runscSockets are the paths where runsc may have made the control socket
// of sandbox id. Releases from 2023 on bind a file, "runsc-<id>.sock", in
// the first of their root, /var/run, /run and /tmp where the bind
// succeeds, and only `runsc delete` removes it: a checkpointed sandbox's
// socket stays, and a stale one pushes the next restore's bind to the next
// directory until none is left. (The 2022 release binds an abstract
// socket; then none of these exist.)
func (r *Runtime) runscSockets(id string) []string {
	name := "runsc-" + id + ".sock"
	return []string{filepath.Join(r.cfg.RuncRoot, name), filepath.Join("/var/run", name), filepath.Join("/run", name), filepath.Join("/tmp", name)}
}

// removeState removes the runtime's own state of id (after a failed
// delete, or once checkpointed; its processes are gone).
func (r *Runtime) removeState(id string) error {
	if r.cfg.GVisor == nil {
		return os.RemoveAll(filepath.Join(r.cfg.RuncRoot, id))
	}
	// A runsc call that found the state file before it goes would put
	// the lock file back (inflight).
	if !r.calls.wait(id, inflightLimit) {
		r.log.Warn("runsc_calls_in_flight", "sandbox_id", id, "waited", inflightLimit)
	}
	var errs []error
	socks := r.runscSockets(id)
	// Where runsc says it bound it, should that be none of the above.
	if rec, ok, _ := r.readRunscRecord(id); ok && rec.Sandbox != nil && filepath.IsAbs(rec.Sandbox.ControlSocketPath) {
		socks = append(socks, rec.Sandbox.ControlSocketPath)
	}
	for _, s := range socks {
		// Only sockets: the paths are runsc's, but a stray file of
		// someone else's by that name is not for Berth to remove.
		if fi, err := os.Lstat(s); err != nil || fi.Mode().Type() != os.ModeSocket {
			continue
		}
		if err := os.Remove(s); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	for _, f := range r.runscStateFiles(id) {
		if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// stateIDs lists the sandbox IDs the runtime's root holds state for.
func (r *Runtime) stateIDs() ([]string, error) {
	ents, err := os.ReadDir(r.cfg.RuncRoot)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	var ids []string
	for _, e := range ents {
		name := e.Name()
		if r.cfg.GVisor != nil {
			id, _, ok := strings.Cut(name, "_sandbox:")
			if ok && validID(id) {
				ids = append(ids, id)
			}
			continue
		}
		if e.IsDir() && validID(name) {
			ids = append(ids, name)
		}
	}
	return ids, nil
}

// runscStats is the part of `runsc events --stats` output we use.
type runscStats struct {
	Data struct {
		Memory struct {
			Usage struct {
				Usage uint64 `json:"usage"`
			} `json:"usage"`
		} `json:"memory"`
		Pids struct {
			Current uint64 `json:"current"`
		} `json:"pids"`
	} `json:"data"`
}

// goferPid is the pid runsc recorded for sandbox id's gofer (0 if none).
// The gofer is not always in the sandbox's cgroup, so the cgroup kill
// may miss it.
func (r *Runtime) goferPid(id string) int {
	rec, ok, err := r.readRunscRecord(id)
	if err != nil || !ok {
		return 0
	}
	return max(rec.GoferPid, 0)
}

// killGofer kills pid if it is still a runsc gofer: `runsc delete` kills
// it, and it exits once the sentry is gone, but a delete that failed (or
// a daemon killed between the two) must not leave it behind. The command
// line check keeps a reused pid safe.
func killGofer(pid int) {
	if pid <= 0 {
		return
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || !bytes.HasPrefix(b, []byte("runsc-gofer")) {
		return
	}
	_ = unix.Kill(pid, unix.SIGKILL)
	// It holds the sandbox's root in its mount namespace: wait (bounded)
	// until it is gone or a zombie (empty cmdline), so the unmount that
	// follows frees the disk image's loop device.
	deadline := time.Now().Add(loopsGoneLimit)
	for time.Now().Before(deadline) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil || len(b) == 0 {
			return
		}
		time.Sleep(10 * time.Millisecond) // poll: no event for another process's exit
	}
}
