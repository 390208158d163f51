package runc

import (
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/berth-sandbox/berth/internal/runtime"
	"github.com/berth-sandbox/berth/proto/envd"
)

// TestGVisorSpecAgentPids: a gVisor sandbox whose agent holds the pids
// limit gives the agent the sentry's CAP_SYS_ADMIN and lets mount and
// umount2 through seccomp, and nothing else; without AgentPids neither.
// The host pids wall is sized for the ptrace stubs either way.
func TestGVisorSpecAgentPids(t *testing.T) {
	r := &Runtime{cfg: Config{UIDBase: 1000000, UIDCount: 65536, CgroupParent: "berth-test", GVisor: &GVisor{}}, nofile: 65536}
	base := runtime.Spec{ID: "sb1", PidsLimit: 64, MemoryBytes: 64 << 20, AgentPath: "/agent"}
	for _, agentPids := range []bool{false, true} {
		s := base
		s.AgentPids = agentPids
		sp := r.ociSpec(s, "/rootfs", 1065536)
		before := seccompNames(sp.Linux.Seccomp.Syscalls)
		gvisorSpec(sp, s, "/proc/1/ns/net", false)
		c := sp.Process.Capabilities
		for name, set := range map[string][]string{"bounding": c.Bounding, "effective": c.Effective, "permitted": c.Permitted} {
			if got := slices.Contains(set, "CAP_SYS_ADMIN"); got != agentPids {
				t.Errorf("AgentPids %v: CAP_SYS_ADMIN in %s = %v", agentPids, name, got)
			}
		}
		after := seccompNames(sp.Linux.Seccomp.Syscalls)
		for _, n := range before {
			allowed := slices.Contains(agentMountCalls, n)
			if got := slices.Contains(after, n); got == (agentPids && allowed) {
				t.Errorf("AgentPids %v: seccomp rule for %s kept = %v", agentPids, n, got)
			}
		}
		if got, want := *sp.Linux.Resources.Pids.Limit, int64(16*64+256); got != want {
			t.Errorf("host pids limit = %d, want %d", got, want)
		}
		// A restore adapts the stored, already adapted config again:
		// nothing may compound (a pids wall multiplied each resume
		// ended past what the kernel accepts).
		caps := len(sp.Process.Capabilities.Bounding)
		gvisorSpec(sp, s, "/proc/1/ns/net", false)
		if got, want := *sp.Linux.Resources.Pids.Limit, int64(16*64+256); got != want {
			t.Errorf("host pids limit after a second pass = %d, want %d", got, want)
		}
		if got := len(sp.Process.Capabilities.Bounding); got != caps {
			t.Errorf("bounding set after a second pass has %d entries, want %d", got, caps)
		}
		// The sentry's RLIMIT_NPROC counts zombies: room for three times
		// the limit of them (nprocLimit), once, whatever the host kernel
		// (this Runtime has no per-namespace count).
		if got := nprocOf(sp); len(got) != 1 || got[0] != 4*64+16 {
			t.Errorf("RLIMIT_NPROC after two passes = %v, want one of %d", got, 4*64+16)
		}
	}
	// No pids limit: no RLIMIT_NPROC.
	s := base
	s.PidsLimit = 0
	sp := r.ociSpec(s, "/rootfs", 1065536)
	gvisorSpec(sp, s, "/proc/1/ns/net", false)
	if got := nprocOf(sp); len(got) != 0 {
		t.Errorf("RLIMIT_NPROC without a pids limit = %v, want none", got)
	}
	// runc: an eighth above the limit where the kernel counts per user
	// namespace, none where it does not.
	rc := &Runtime{cfg: r.cfg, nofile: r.nofile}
	rc.cfg.GVisor = nil
	for _, nsNproc := range []bool{false, true} {
		rc.nsNproc = nsNproc
		want := map[bool][]uint64{false: nil, true: {64 + 8 + 16}}[nsNproc]
		if got := nprocOf(rc.ociSpec(base, "/rootfs", 1065536)); !slices.Equal(got, want) {
			t.Errorf("runc RLIMIT_NPROC (per-namespace count %v) = %v, want %v", nsNproc, got, want)
		}
	}
	// The runc profile the gVisor one is cut from stays whole.
	if names := seccompNames(seccompProfile().Syscalls); !slices.Contains(names, "mount") || !slices.Contains(names, "umount2") {
		t.Errorf("runc seccomp profile lost its mount rules: %v", names)
	}
}

// TestGVisorSpecSetuid: no_new_privs is off only for a sandbox that asks
// for set-user-ID programs (AllowSetuid, what E2B creates ask for) on a
// runsc that honours them (--allow-suid), whether or not its agent holds
// the pids limit; a runsc without the flag would not raise them anyway,
// so every sandbox of it keeps no_new_privs. The flag goes only to
// sandboxes that get no no_new_privs.
func TestGVisorSpecSetuid(t *testing.T) {
	for _, c := range []struct {
		allow, agentPids, runscSUID bool
		wantNNP                     bool
	}{
		{allow: false, agentPids: true, runscSUID: true, wantNNP: true},
		{allow: false, agentPids: false, runscSUID: true, wantNNP: true},
		{allow: true, agentPids: true, runscSUID: true, wantNNP: false},
		{allow: true, agentPids: false, runscSUID: true, wantNNP: false},
		{allow: true, agentPids: true, runscSUID: false, wantNNP: true},
		{allow: true, agentPids: false, runscSUID: false, wantNNP: true},
	} {
		r := &Runtime{cfg: Config{UIDBase: 1000000, UIDCount: 65536, CgroupParent: "berth-test", GVisor: &GVisor{AllowSUID: c.runscSUID}}, nofile: 65536}
		s := runtime.Spec{ID: "sb1", PidsLimit: 64, MemoryBytes: 64 << 20, AgentPath: "/agent", AllowSetuid: c.allow, AgentPids: c.agentPids}
		sp := r.ociSpec(s, "/rootfs", 1065536)
		// Twice: a restore adapts the adapted config again.
		for range 2 {
			gvisorSpec(sp, s, "/proc/1/ns/net", r.raisesSetuid(s))
			if sp.Process.NoNewPrivileges != c.wantNNP {
				t.Errorf("AllowSetuid %v, AgentPids %v, runsc --allow-suid %v: NoNewPrivileges = %v, want %v", c.allow, c.agentPids, c.runscSUID, sp.Process.NoNewPrivileges, c.wantNNP)
			}
		}
		if got := r.raisesSetuid(s); got == c.wantNNP {
			t.Errorf("AllowSetuid %v, runsc --allow-suid %v: --allow-suid passed = %v, want %v", c.allow, c.runscSUID, got, !c.wantNNP)
		}
	}
}

func seccompNames(rules []specs.LinuxSyscall) []string {
	var out []string
	for _, r := range rules {
		out = append(out, r.Names...)
	}
	return out
}

// TestDiskTmp: a gVisor sandbox's /tmp is a bind of its root's own /tmp
// (on the disk, not a tmpfs in the sentry's memory), added once, and not
// where the root's /tmp is missing, a symlink or already mounted.
func TestDiskTmp(t *testing.T) {
	bindsTmp := func(sp *specs.Spec) int {
		n := 0
		for _, m := range sp.Mounts {
			if m.Destination == "/tmp" {
				n++
			}
		}
		return n
	}
	dir := t.TempDir()
	withTmp := filepath.Join(dir, "a")
	if err := os.MkdirAll(filepath.Join(withTmp, "tmp"), 0o755); err != nil {
		t.Fatal(err)
	}
	sp := &specs.Spec{Root: &specs.Root{Path: withTmp}}
	diskTmp(sp)
	diskTmp(sp)
	if got := bindsTmp(sp); got != 1 {
		t.Fatalf("/tmp mounts after two passes = %d, want 1: %+v", got, sp.Mounts)
	}
	if m := sp.Mounts[0]; m.Type != "bind" || m.Source != filepath.Join(withTmp, "tmp") {
		t.Errorf("/tmp mount = %+v, want a bind of the root's tmp", m)
	}
	link := filepath.Join(dir, "b")
	if err := os.MkdirAll(link, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/", filepath.Join(link, "tmp")); err != nil {
		t.Fatal(err)
	}
	for name, root := range map[string]string{"missing": filepath.Join(dir, "none"), "symlink": link} {
		sp := &specs.Spec{Root: &specs.Root{Path: root}}
		diskTmp(sp)
		if got := bindsTmp(sp); got != 0 {
			t.Errorf("%s /tmp: %d mounts, want none: %+v", name, got, sp.Mounts)
		}
	}
	own := &specs.Spec{Root: &specs.Root{Path: withTmp}, Mounts: []specs.Mount{{Destination: "/tmp/", Type: "tmpfs"}}}
	diskTmp(own)
	if len(own.Mounts) != 1 || own.Mounts[0].Type != "tmpfs" {
		t.Errorf("an explicit /tmp mount was changed: %+v", own.Mounts)
	}
}

// TestAgentErrnoCalls: the profile's unconditional rules with an errno
// other than EPERM (runsc would answer EPERM: glibc then starts no
// thread) leave a gVisor sandbox's profile for the agent's environment,
// once; every other rule stays.
func TestAgentErrnoCalls(t *testing.T) {
	sp := &specs.Spec{Process: &specs.Process{Env: []string{"A=1"}}, Linux: &specs.Linux{Seccomp: seccompProfile()}}
	before := len(sp.Linux.Seccomp.Syscalls)
	agentErrnoCalls(sp)
	agentErrnoCalls(sp)
	names := seccompNames(sp.Linux.Seccomp.Syscalls)
	for _, gone := range []string{"clone3", "io_setup", "io_submit"} {
		if slices.Contains(names, gone) {
			t.Errorf("%s still in the gVisor profile", gone)
		}
	}
	for _, kept := range []string{"clone", "unshare", "socket", "keyctl"} {
		if !slices.Contains(names, kept) {
			t.Errorf("%s left the gVisor profile", kept)
		}
	}
	for _, r := range sp.Linux.Seccomp.Syscalls {
		if r.Action == specs.ActErrno && r.ErrnoRet != nil && *r.ErrnoRet != errnoEPERM && len(r.Args) == 0 {
			t.Errorf("rule %v with errno %d kept", r.Names, *r.ErrnoRet)
		}
	}
	if len(sp.Linux.Seccomp.Syscalls) >= before {
		t.Errorf("profile has %d rules, had %d", len(sp.Linux.Seccomp.Syscalls), before)
	}
	var env []string
	for _, e := range sp.Process.Env {
		if strings.HasPrefix(e, envd.ErrnoCallsEnv+"=") {
			env = append(env, e)
		}
	}
	if len(env) != 1 || !strings.Contains(env[0], "clone3:38") || !strings.Contains(env[0], "io_setup:38") || !slices.Contains(sp.Process.Env, "A=1") {
		t.Errorf("env = %v, want one %s with clone3:38 and io_setup:38, A=1 kept", sp.Process.Env, envd.ErrnoCallsEnv)
	}
	// The runc profile itself is untouched.
	if !slices.Contains(seccompNames(seccompProfile().Syscalls), "clone3") {
		t.Error("runc's profile lost clone3")
	}
}

// TestCheckpointRestoreArgs: background restore and direct image I/O add
// their flags and nothing else, so a runsc without them (Debian's) gets
// the bare commands it always got; --direct only where the image's
// directory takes O_DIRECT.
func TestCheckpointRestoreArgs(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "pages.img"), make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	direct := directWrites(dir)
	t.Logf("%s takes O_DIRECT: %v", dir, direct)
	if directReads(dir) != direct {
		t.Errorf("directReads(%s) = %v, directWrites %v", dir, !direct, direct)
	}
	if _, err := os.Stat(filepath.Join(dir, directProbe)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("probe file left behind: %v", err)
	}
	ifDirect := func(args ...string) []string {
		if direct {
			return append(args, "--direct")
		}
		return args
	}
	cases := []struct {
		g                 GVisor
		checkpoint, restr []string
	}{
		{GVisor{}, nil, nil},
		{GVisor{BackgroundRestore: true}, []string{"--compression=none"}, []string{"--background"}},
		{GVisor{DirectImageIO: true}, ifDirect(), ifDirect()},
		{GVisor{BackgroundRestore: true, DirectImageIO: true}, ifDirect("--compression=none"), ifDirect("--background")},
	}
	for _, c := range cases {
		if got := c.g.checkpointArgs(dir); !slices.Equal(got, c.checkpoint) {
			t.Errorf("%+v.checkpointArgs() = %q, want %q", c.g, got, c.checkpoint)
		}
		if got := c.g.restoreArgs(dir); !slices.Equal(got, c.restr) {
			t.Errorf("%+v.restoreArgs() = %q, want %q", c.g, got, c.restr)
		}
	}
	// No image to read, or no directory at all: no --direct, and runsc
	// says what is wrong with the image.
	g := GVisor{DirectImageIO: true}
	if got := g.restoreArgs(t.TempDir()); len(got) != 0 {
		t.Errorf("restoreArgs(empty dir) = %q, want none", got)
	}
	missing := filepath.Join(dir, "missing")
	if got := g.checkpointArgs(missing); len(got) != 0 {
		t.Errorf("checkpointArgs(missing dir) = %q, want none", got)
	}
	if got := g.restoreArgs(missing); len(got) != 0 {
		t.Errorf("restoreArgs(missing dir) = %q, want none", got)
	}
}

// TestDirectIOProbesAgree: on the test's file system and on tmpfs (which
// takes O_DIRECT from Linux 6.6 on), the probes say what an O_DIRECT
// open of a new file there says.
func TestDirectIOProbesAgree(t *testing.T) {
	for _, dir := range []string{t.TempDir(), "/dev/shm"} {
		probe, err := os.MkdirTemp(dir, "direct-")
		if err != nil {
			t.Fatal(err)
		}
		defer os.RemoveAll(probe)
		f, err := os.OpenFile(filepath.Join(probe, "x"), os.O_CREATE|os.O_WRONLY|unix.O_DIRECT, 0o600)
		want := err == nil
		if err == nil {
			f.Close()
		}
		if got := directWrites(probe); got != want {
			t.Errorf("directWrites(%s) = %v, an O_DIRECT open says %v (%v)", probe, got, want, err)
		}
		if got := directReads(probe); got != want {
			t.Errorf("directReads(%s) = %v, an O_DIRECT open says %v", probe, got, want)
		}
	}
}

// nprocOf is every RLIMIT_NPROC of sp (hard; soft must match).
func nprocOf(sp *specs.Spec) []uint64 {
	var out []uint64
	for _, l := range sp.Process.Rlimits {
		if l.Type == "RLIMIT_NPROC" {
			if l.Soft != l.Hard {
				return append(out, 0)
			}
			out = append(out, l.Hard)
		}
	}
	return out
}

func TestRestoreCPU(t *testing.T) {
	period := uint64(100000)
	cpu := func(quota int64) *specs.LinuxCPU { return &specs.LinuxCPU{Period: ptr(period), Quota: ptr(quota)} }
	for _, c := range []struct {
		in   *specs.LinuxCPU
		want int64 // 0: nothing lifted
	}{
		{nil, 0},
		{&specs.LinuxCPU{}, 0},
		{cpu(-1), 0},
		{cpu(10000), 200000},  // 0.1 core: as many as the sentry's 2 CPUs
		{cpu(100000), 200000}, // 1 core
		{cpu(150000), 200000}, // 1.5
		{cpu(200000), 0},      // 2: already
		{cpu(250000), 300000}, // 2.5: rounded up, as runsc counts CPUs
		{cpu(800000), 0},      // 8
	} {
		got := restoreCPU(c.in)
		switch {
		case c.want == 0 && got != nil:
			t.Errorf("restoreCPU(%+v) = %d, want nothing lifted", c.in, *got.Quota)
		case c.want != 0 && (got == nil || *got.Quota != c.want || *got.Period != period):
			t.Errorf("restoreCPU(%+v) = %+v, want quota %d", c.in, got, c.want)
		case c.want != 0 && *c.in.Quota == *got.Quota:
			t.Errorf("restoreCPU changed its input")
		}
	}
}

// TestSentryStatsKept: a sentry's answer to `runsc events --stats` serves
// the samples that follow for a while (one runsc start per sandbox per
// defaultSentryStatsTTL, not per sample), and is asked again once that is
// over.
func TestSentryStatsKept(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "runsc")
	calls := filepath.Join(dir, "calls")
	script := "#!/bin/sh\necho x >> " + calls + "\n" +
		`echo '{"type":"stats","id":"sb1","data":{"memory":{"usage":{"usage":12345}},"pids":{"current":7}}}'` + "\n"
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	r := &Runtime{cfg: Config{Binary: bin, RuncRoot: dir, StateDir: filepath.Join(dir, "state")}, log: slog.New(slog.DiscardHandler)}
	asked := func() int {
		b, _ := os.ReadFile(calls)
		return strings.Count(string(b), "x")
	}
	cpu := time.Second // the cgroup's CPU usage
	sample := func(want int) {
		t.Helper()
		s := runtime.Stats{CPUUsage: cpu, MemoryBytes: 1, PidsCurrent: 1, PidsRefused: 3}
		r.sentryStats(t.Context(), "sb1", &s)
		if s.MemoryBytes != 12345 || s.PidsCurrent != 7 || s.PidsRefused != 0 {
			t.Errorf("stats = %+v, want the sentry's memory 12345 and 7 tasks", s)
		}
		if got := asked(); got != want {
			t.Errorf("runsc asked %d times, want %d", got, want)
		}
	}
	sample(1)
	sample(1) // kept
	r.sentryStatsTTL = time.Nanosecond
	sample(1) // over, but the sandbox has been idle since: kept
	cpu += time.Second
	sample(2) // over and busy meanwhile: asked again
	r.sentryStatsTTL = 0
	sample(2)
}

func TestSentrySampleServes(t *testing.T) {
	at := time.Unix(1000, 0)
	c := sentrySample{at: at, cpu: time.Second}
	ttl := 5 * time.Second
	for _, tc := range []struct {
		name string
		age  time.Duration
		cpu  time.Duration
		want bool
	}{
		{"young, busy", time.Second, 10 * time.Second, true},
		{"old, idle", 20 * time.Second, time.Second + sentryIdleCPU, true},
		{"old, half a percent of a core", 20 * time.Second, time.Second + sentryIdleCPU + 100*time.Millisecond, true},
		{"old, busier", 20 * time.Second, time.Second + sentryIdleCPU + 101*time.Millisecond, false},
		{"idle but too old", sentryIdleTTL, time.Second, false},
	} {
		if got := c.serves(at.Add(tc.age), tc.cpu, ttl); got != tc.want {
			t.Errorf("%s: serves(age %v, cpu %v) = %v, want %v", tc.name, tc.age, tc.cpu, got, tc.want)
		}
	}
}
