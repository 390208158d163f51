package hostile

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/moby/sys/mountinfo"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/test/harness"
)

// The daemon's default canonical uid range (uid_base, uid_count): it owns
// the template layers on disk, and every sandbox's own range lies above
// it. A process with a uid from uidBase up outside every sandbox cgroup
// has escaped its sandbox.
const (
	uidBase  = 1000000
	uidCount = 65536
)

// lab is one daemon with an attacker sandbox and a neighbour, plus what
// the host looked like before the attacks.
type lab struct {
	d        *harness.Daemon
	sb       *client.Sandbox // the attacker
	nb       *client.Sandbox // the neighbour, whose data must survive
	nbMarker string          // content of the neighbour's /root/marker

	canaryDir string // host directory with a planted file
	canary    string // host file the sandbox must neither read nor change
	canarySum string
	agentSum  string
	mounts    map[string]bool
}

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func fileSum(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatalf("hash %s: %v", p, err)
	}
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// newLab starts a daemon and two sandboxes; req shapes the attacker's.
func newLab(t *testing.T, req client.CreateRequest, extra ...string) *lab {
	t.Helper()
	d := harness.StartDaemon(t, bin, extra...)
	l := &lab{d: d}
	dir, err := os.MkdirTemp("/tmp", "berth-hostile-canary-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	// World-readable on purpose: only the namespaces keep it out of reach.
	os.Chmod(dir, 0o777)
	l.canaryDir, l.canary = dir, filepath.Join(dir, "secret")
	if err := os.WriteFile(l.canary, []byte("host-only "+randHex(8)), 0o666); err != nil {
		t.Fatal(err)
	}
	l.canarySum = fileSum(t, l.canary)
	l.agentSum = fileSum(t, bin.Agent)
	l.mounts = hostMounts(d)

	l.sb = d.Create(t, req)
	l.nb = d.Create(t, client.CreateRequest{})
	l.nbMarker = "neighbour " + randHex(8)
	harness.MustRun(t, l.nb, "mkdir -p /root && echo '"+l.nbMarker+"' > /root/marker")
	if _, err := l.nb.Start(t.Context(), client.ExecRequest{Cmd: "/bin/sh", Args: []string{"-c", "sleep 100000; : neighbour-sleeper"}}); err != nil {
		t.Fatalf("start neighbour process: %v", err)
	}
	l.copyAttacker(t, l.sb)
	return l
}

// copyAttacker puts the attack tool at /tmp/attacker in sb.
func (l *lab) copyAttacker(t *testing.T, sb *client.Sandbox) {
	t.Helper()
	f, err := os.Open(attackerBin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := sb.WriteFile(t.Context(), "/tmp/attacker", f); err != nil {
		t.Fatalf("copy attacker: %v", err)
	}
	harness.MustRun(t, sb, "chmod 755 /tmp/attacker")
}

// attack runs the attack tool's subcommand in the attacker sandbox and
// asserts that the sandbox held.
func (l *lab) attack(t *testing.T, name string, args ...string) string {
	t.Helper()
	o, e, code := l.exec(t, l.sb, "/tmp/attacker", append([]string{name}, args...)...)
	if code != 0 || !strings.Contains(o, "blocked:") || strings.Contains(o, "ESCAPED") {
		t.Errorf("attack %s: exit %d\nstdout: %s\nstderr: %s", name, code, o, e)
	}
	t.Logf("%s: %s", name, strings.TrimSpace(o))
	return o
}

func (l *lab) exec(t *testing.T, sb *client.Sandbox, cmd string, args ...string) (string, string, int) {
	t.Helper()
	var o, e bytes.Buffer
	ctx, cancel := context.WithTimeout(t.Context(), 120*time.Second)
	defer cancel()
	code, err := sb.Exec(ctx, client.ExecRequest{Cmd: cmd, Args: args, Stdout: &o, Stderr: &e})
	if err != nil {
		t.Fatalf("exec %s %q: %v\n%s", cmd, args, err, l.d.Logs())
	}
	return o.String(), e.String(), code
}

// shell runs script in the attacker sandbox; it must exit 0 (the script
// itself checks that the attack failed and exits non-zero otherwise).
func (l *lab) shell(t *testing.T, script string) string {
	t.Helper()
	o, e, code := l.exec(t, l.sb, "/bin/sh", "-c", script)
	if code != 0 {
		t.Errorf("attack script exited %d\nscript: %s\nstdout: %s\nstderr: %s", code, script, o, e)
	}
	return o
}

// check asserts that the host and the neighbour are as they were.
func (l *lab) check(t *testing.T) {
	t.Helper()
	if got := fileSum(t, l.canary); got != l.canarySum {
		t.Errorf("host canary %s changed", l.canary)
	}
	if ents, _ := os.ReadDir(l.canaryDir); len(ents) != 1 {
		t.Errorf("host canary dir %s has %d entries, want 1", l.canaryDir, len(ents))
	}
	if got := fileSum(t, bin.Agent); got != l.agentSum {
		t.Errorf("host agent binary %s changed", bin.Agent)
	}
	var got bytes.Buffer
	if err := l.nb.ReadFile(t.Context(), "/root/marker", &got); err != nil || strings.TrimSpace(got.String()) != l.nbMarker {
		t.Errorf("neighbour's /root/marker = %q, %v; want %q", got.String(), err, l.nbMarker)
	}
	for m := range hostMounts(l.d) {
		if !l.mounts[m] {
			t.Errorf("new host mount %s", m)
		}
	}
	for _, p := range escapedProcs() {
		t.Errorf("escaped process: %s", p)
	}
}

// hostMounts lists the host's mount points that are not sandbox mounts.
func hostMounts(d *harness.Daemon) map[string]bool {
	out := map[string]bool{}
	mounts, err := mountinfo.GetMounts(nil)
	if err != nil {
		return out
	}
	for _, m := range mounts {
		mp := m.Mountpoint
		// A test's FUSE image (harness.ServeHeld), which an e2e or
		// runtime test running beside this package serves to its own
		// gVisor sandbox.
		if m.Source == harness.HeldSource {
			continue
		}
		// Sandbox mounts come and go: this daemon's and those of any
		// other daemon or runtime test on the host (each sandbox's rootfs
		// and disk, under sandboxes/<id>/ or a state dir), and network
		// namespaces.
		if strings.Contains(mp, d.DataDir) || strings.Contains(mp, d.Instance) ||
			strings.Contains(mp, "/sandboxes/") || strings.Contains(mp, "/netns/") ||
			strings.HasSuffix(mp, "/rootfs") || strings.HasSuffix(mp, "/disk") ||
			// runc's short-lived read-only clone of its own binary,
			// mounted in its state dir while it starts a container.
			strings.HasPrefix(filepath.Base(mp), "runc.") ||
			// A volume's host mount (<data-dir>/volumes/<id>/mnt, while
			// a sandbox is made with it or its files are served) and a
			// runtime's idmapped clone of it (<state dir>/<id>/vol/<n>,
			// while the sandbox binds it), of any daemon or runtime
			// test on the host.
			strings.Contains(mp, "/volumes/vol") || filepath.Base(filepath.Dir(mp)) == "vol" {
			continue
		}
		out[mp] = true
	}
	return out
}

// escapedProcs lists host processes running as a sandbox uid outside every
// berth cgroup. A process being set up by runc on the host is briefly in
// that state too (and other runtime tests may run beside this one), so a
// candidate counts only if it is still there, alive and outside, a moment
// later.
func escapedProcs() []string {
	first := outsideProcs()
	if len(first) == 0 {
		return nil
	}
	time.Sleep(500 * time.Millisecond) // a grace period, not a wait for an event
	var out []string
	for pid, desc := range outsideProcs() {
		if _, ok := first[pid]; ok {
			out = append(out, pid+" "+desc)
		}
	}
	return out
}

// outsideProcs maps pid to command line and cgroups of live processes with
// a sandbox uid outside every berth cgroup.
func outsideProcs() map[string]string {
	out := map[string]string{}
	for _, p := range harness.Procs(func(p harness.Proc) bool {
		return p.UID >= uidBase && p.UID != 1<<32-1 && !strings.Contains(p.Cgroup, "/berth-") && !userNSHolder(p)
	}) {
		out[strconv.Itoa(p.PID)] = p.Cmdline + " cgroups: " + strings.ReplaceAll(p.Cgroup, "\n", " ")
	}
	return out
}

// userNSHolder reports whether p is the short-lived process a daemon
// runs as a sandbox's root uid to make the sandbox's user namespace
// (unshare, then cat, a direct child of `berth serve`) before runc joins
// it.
func userNSHolder(p harness.Proc) bool {
	if p.Comm != "cat" && p.Comm != "unshare" {
		return false
	}
	cmd, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(p.PPID), "cmdline"))
	args := strings.Split(string(cmd), "\x00")
	return len(args) > 1 && args[1] == "serve"
}
