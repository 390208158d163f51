// Package harness runs the real berth daemon for end-to-end tests and
// benchmarks: it builds the binaries, starts `berth serve` with its own data
// dir, instance name and port, and checks that nothing of its sandboxes is
// left on the host afterwards.
package harness

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/moby/sys/mountinfo"

	"github.com/berth-sandbox/berth/client"
)

// Binaries are the built berth and berth-agent.
type Binaries struct {
	Dir, Berth, Agent string
	// UDPEcho is a static UDP echo server (./udpecho) for sandboxes.
	UDPEcho string
}

// Build builds berth and the static berth-agent into a temporary dir; call
// the returned cleanup when done.
func Build() (Binaries, func(), error) {
	dir, err := os.MkdirTemp("", "berth-bin-")
	if err != nil {
		return Binaries{}, nil, err
	}
	cleanup := func() { os.RemoveAll(dir) }
	b := Binaries{Dir: dir, Berth: filepath.Join(dir, "berth"), Agent: filepath.Join(dir, "berth-agent"), UDPEcho: filepath.Join(dir, "udpecho")}
	if err := GoBuild(b.Berth, "./cmd/berth", false); err != nil {
		cleanup()
		return Binaries{}, nil, err
	}
	if err := GoBuild(b.Agent, "./cmd/berth-agent", true); err != nil {
		cleanup()
		return Binaries{}, nil, err
	}
	if err := GoBuild(b.UDPEcho, "./test/harness/udpecho", true); err != nil {
		cleanup()
		return Binaries{}, nil, err
	}
	return b, cleanup, nil
}

// GoBuild builds the repository's package pkg (a path like "./cmd/berth")
// into out; static builds it without cgo, for use inside sandboxes.
func GoBuild(out, pkg string, static bool) error {
	cmd := exec.Command("go", "build", "-o", out, pkg)
	cmd.Dir = repoRoot()
	cmd.Env = os.Environ()
	if static {
		cmd.Env = append(cmd.Env, "CGO_ENABLED=0")
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %v\n%s", pkg, err, out)
	}
	return nil
}

// Main is a test package's TestMain: it builds the binaries into *bin,
// runs prepare (if any) with them, runs the tests (m is the *testing.M)
// and removes the build. Use: os.Exit(harness.Main(m, &bin, nil)).
func Main(m interface{ Run() int }, bin *Binaries, prepare func(Binaries) error) int {
	b, cleanup, err := Build()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer cleanup()
	*bin = b
	if prepare != nil {
		if err := prepare(b); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	return m.Run()
}

// TB is the part of testing.TB the harness uses, so benchmarks outside
// `go test` can drive it too.
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
	Errorf(format string, args ...any)
	Logf(format string, args ...any)
	Skip(args ...any)
	Cleanup(func())
	TempDir() string
	Failed() bool
}

func repoRoot() string {
	wd, _ := os.Getwd()
	for d := wd; d != "/"; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d
		}
	}
	return wd
}

// RequireHost skips unless this is root on a host with runc.
func RequireHost(t TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("end-to-end tests need root (they run the real daemon)")
	}
	if _, err := exec.LookPath("runc"); err != nil {
		t.Skip("runc is not installed (apt-get install runc)")
	}
}

// CacheDir is where the debootstrap base is cached between runs.
func CacheDir() string {
	if d := os.Getenv("BERTH_CACHE_DIR"); d != "" {
		return d
	}
	return "/var/cache/berth"
}

// Daemon is one running berth daemon under test.
type Daemon struct {
	t        TB
	bin      Binaries
	DataDir  string
	Instance string
	Addr     string
	URL      string
	// Client talks TCP without a key: the operator on a daemon that
	// requires none.
	Client *client.Client
	// SocketURL is the daemon's root-only local socket (unix://…) and
	// Local a client through it: the operator, even with --require-auth.
	SocketURL string
	Local     *client.Client
	extra     []string
	// command is the subcommand and its own arguments: serve, or node
	// and its flags (StartNode).
	command []string

	mu   sync.Mutex
	cmd  *exec.Cmd
	logs *bytes.Buffer
	done chan struct{}
}

func randName(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)[:n]
}

func freeAddr(t TB) string {
	t.Helper()
	return fmt.Sprintf("127.0.0.1:%d", FreePort(t))
}

// portsGiven are the ports FreePort handed out in this process.
var portsGiven = struct {
	sync.Mutex
	m map[int]bool
}{m: map[int]bool{}}

// FreePort returns a loopback TCP port nothing listens on now, and one
// this process never handed out before: a port is free only until the
// process it is meant for binds it, so two picks before either binds
// (a daemon's API and a node's kubelet API, say) could otherwise get the
// same one.
func FreePort(t TB) int {
	t.Helper()
	for range 100 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("%v", err)
		}
		p := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		portsGiven.Lock()
		seen := portsGiven.m[p]
		portsGiven.m[p] = true
		portsGiven.Unlock()
		if !seen {
			return p
		}
	}
	t.Fatalf("no loopback port free that was not handed out before")
	return 0
}

// StartDaemon starts a daemon with its own data dir, instance name and
// port. Extra arguments go to `berth serve`. The daemon is stopped and
// checked for leaks when the test ends.
func StartDaemon(t TB, bin Binaries, extra ...string) *Daemon {
	t.Helper()
	return startDaemon(t, bin, []string{"serve"}, extra)
}

// StartNode starts `berth node` (the daemon and a Kubernetes node) with
// nodeArgs, its node flags, like StartDaemon starts `berth serve`.
func StartNode(t TB, bin Binaries, nodeArgs []string, extra ...string) *Daemon {
	t.Helper()
	return startDaemon(t, bin, append([]string{"node"}, nodeArgs...), extra)
}

func startDaemon(t TB, bin Binaries, command, extra []string) *Daemon {
	t.Helper()
	RequireHost(t)
	d := &Daemon{t: t, bin: bin, DataDir: t.TempDir(), Instance: "t" + randName(5), Addr: freeAddr(t), extra: extra, command: command}
	d.URL = "http://" + d.Addr
	// The sandboxes' mapped root must traverse the path to the data dir.
	if err := os.Chmod(filepath.Dir(d.DataDir), 0o711); err != nil {
		t.Fatalf("%v", err)
	}
	c, err := client.New(d.URL)
	if err != nil {
		t.Fatalf("%v", err)
	}
	d.Client = c
	d.SocketURL = "unix://" + filepath.Join(d.DataDir, "berth.sock")
	if d.Local, err = client.New(d.SocketURL); err != nil {
		t.Fatalf("%v", err)
	}
	d.Start()
	t.Cleanup(func() {
		d.DestroyAll()
		d.Stop()
		AssertNoLeaks(t, d)
		AssertStoppedClean(t, d)
		if t.Failed() {
			t.Logf("daemon log:\n%s", d.Logs())
		}
	})
	return d
}

// Start (re)starts the daemon process and waits until it answers.
func (d *Daemon) Start() {
	t := d.t
	t.Helper()
	args := append(append([]string{}, d.command...), "--listen", d.Addr, "--data-dir", d.DataDir, "--instance", d.Instance,
		"--cache-dir", CacheDir(), "--agent", d.bin.Agent, "--default-template", "minimal",
		// Test daemons leave port 80 alone; a test that wants preview
		// hosts passes its own --preview-listen.
		"--preview-listen", "none")
	args = append(args, d.extra...)
	cmd := exec.Command(d.bin.Berth, args...)
	d.mu.Lock()
	if d.logs == nil {
		d.logs = &bytes.Buffer{}
	}
	cmd.Stdout = lockedWriter{&d.mu, d.logs}
	cmd.Stderr = lockedWriter{&d.mu, d.logs}
	d.mu.Unlock()
	if err := cmd.Start(); err != nil {
		t.Fatalf("%v", err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	d.mu.Lock()
	d.cmd, d.done = cmd, done
	d.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for {
		if _, err := d.Client.Health(ctx); err == nil {
			return
		}
		select {
		case <-done:
			t.Fatalf("daemon exited during start:\n%s", d.Logs())
		case <-ctx.Done():
			t.Fatalf("daemon did not answer within 60s:\n%s", d.Logs())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// SyncBuffer is a bytes.Buffer one goroutine may write (a process's
// output) while another reads it.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// Logs returns what the daemon printed so far.
func (d *Daemon) Logs() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.logs == nil {
		return ""
	}
	return d.logs.String()
}

// Kill9 kills the daemon with SIGKILL and waits for it to be gone.
func (d *Daemon) Kill9() {
	d.mu.Lock()
	cmd, done := d.cmd, d.done
	d.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Signal(syscall.SIGKILL)
	<-done
	d.mu.Lock()
	d.cmd = nil
	d.mu.Unlock()
}

// Stop sends SIGTERM and waits for a clean exit.
func (d *Daemon) Stop() {
	d.mu.Lock()
	cmd, done := d.cmd, d.done
	d.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
		if st := cmd.ProcessState; st != nil && !st.Success() {
			d.t.Errorf("daemon exited uncleanly after SIGTERM: %v\n%s", st, d.Logs())
		}
	case <-time.After(30 * time.Second):
		d.t.Errorf("daemon did not stop within 30s of SIGTERM")
		cmd.Process.Kill()
		<-done
	}
	d.mu.Lock()
	d.cmd = nil
	d.mu.Unlock()
}

// DestroyAll kills every live sandbox of the daemon.
func (d *Daemon) DestroyAll() {
	d.mu.Lock()
	running := d.cmd != nil
	d.mu.Unlock()
	if !running {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// Through the socket: it sees every key's sandboxes, with or
	// without --require-auth.
	sbs, err := d.Local.List(ctx, client.ListOptions{})
	if err != nil {
		d.t.Errorf("list sandboxes: %v", err)
		return
	}
	for _, sb := range sbs {
		if sb.State == client.StateReady || sb.State == client.StatePaused || sb.State == client.StateCreating {
			// Each kill its own bound: a density test leaves a hundred
			// sandboxes, which a loaded host takes minutes to destroy.
			kctx, kcancel := context.WithTimeout(context.Background(), 60*time.Second)
			if err := d.Local.Kill(kctx, sb.ID); err != nil {
				d.t.Errorf("kill %s: %v", sb.ID, err)
			}
			kcancel()
		}
	}
}

// CLI runs the berth CLI against this daemon.
func (d *Daemon) CLI(t TB, stdin io.Reader, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	return d.CLIEnv(t, stdin, []string{"BERTH_URL=" + d.URL}, args...)
}

// CLIEnv runs the berth CLI with env added to the test's environment
// (BERTH_URL, BERTH_API_KEY, …).
func (d *Daemon) CLIEnv(t TB, stdin io.Reader, env []string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(d.bin.Berth, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdin = stdin
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	code = 0
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			t.Fatalf("berth %v: %v", args, err)
		}
		code = ee.ExitCode()
	}
	return o.String(), e.String(), code
}

// Create makes a sandbox from the minimal template unless req says otherwise.
func (d *Daemon) Create(t TB, req client.CreateRequest) *client.Sandbox {
	t.Helper()
	if req.Template == "" {
		req.Template = "minimal"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	sb, err := d.Client.Create(ctx, req)
	if err != nil {
		t.Fatalf("create %+v: %v\n%s", req, err, d.Logs())
	}
	return sb
}

// Run executes a shell command in sb and returns stdout, stderr and the
// exit code.
func Run(t TB, sb *client.Sandbox, script string) (string, string, int) {
	t.Helper()
	o, e, code, err := Exec(sb, script)
	if err != nil {
		t.Fatalf("exec %q: %v", script, err)
	}
	return o, e, code
}

// Exec runs script under /bin/sh in sb, bounded at 60 s, and returns its
// output and exit code; err is the call's failure (for goroutines, which
// may not end the test).
func Exec(sb *client.Sandbox, script string) (stdout, stderr string, code int, err error) {
	var o, e bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	code, err = sb.Exec(ctx, client.ExecRequest{Cmd: "/bin/sh", Args: []string{"-c", script}, Stdout: &o, Stderr: &e})
	return o.String(), e.String(), code, err
}

// MustRun is Run that fails the test on a non-zero exit.
func MustRun(t TB, sb *client.Sandbox, script string) string {
	t.Helper()
	o, e, code := Run(t, sb, script)
	if code != 0 {
		t.Fatalf("%q exited %d\nstdout: %s\nstderr: %s", script, code, o, e)
	}
	return o
}

// CheckpointDir is where the daemon keeps sandbox id's checkpoint while it
// is paused with its memory.
func (d *Daemon) CheckpointDir(id string) string {
	return filepath.Join(d.DataDir, "checkpoints", id)
}

// WaitCheckpointFlushed waits for the daemon to mark paused sandbox id's
// checkpoint flushed to the disk (internal/sandbox/pausesync.go), which it
// does in the background and says by a file appearing in it.
func (d *Daemon) WaitCheckpointFlushed(t TB, id string) {
	t.Helper()
	mark := filepath.Join(d.CheckpointDir(id), ".berth-synced")
	WaitFor(t, 2*time.Minute, "checkpoint of "+id+" flushed ("+mark+")", func() bool {
		_, err := os.Lstat(mark)
		return err == nil
	})
}

// WaitFor polls cond until it holds or the timeout passes.
func WaitFor(t TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// AssertNoLeaks checks that nothing of the daemon's sandboxes is left on
// the host: mounts, network namespaces, links, cgroups, runc state,
// processes in the daemon's cgroups, nftables chains and map elements.
func AssertNoLeaks(t TB, d *Daemon) {
	t.Helper()
	for _, l := range Leaks(d) {
		t.Errorf("leak: %s", l)
	}
}

// cgroupRoots are where a daemon's cgroup parent may live, on cgroup v1
// (one hierarchy per controller), hybrid and v2 hosts.
var cgroupRoots = []string{"/sys/fs/cgroup/memory", "/sys/fs/cgroup/pids", "/sys/fs/cgroup/cpu", "/sys/fs/cgroup/unified", "/sys/fs/cgroup"}

// NftTable is the daemon instance's nftables table (family inet).
func (d *Daemon) NftTable() string { return "berth_" + d.Instance }

// AssertStoppedClean checks, after the daemon stopped with no sandbox left,
// that nothing of the instance itself is left either (StoppedLeaks).
func AssertStoppedClean(t TB, d *Daemon) {
	t.Helper()
	for _, l := range StoppedLeaks(d) {
		t.Errorf("leak after the daemon stopped: %s", l)
	}
}

// StoppedLeaks lists the host objects a daemon instance keeps while it runs
// and must remove when it stops with no sandbox left: its nftables table and
// its cgroup parents. Everything per sandbox is Leaks' business.
func StoppedLeaks(d *Daemon) []string {
	var out []string
	if nftTableExists(d.NftTable()) {
		out = append(out, "nftables table inet "+d.NftTable())
	}
	for _, root := range cgroupRoots {
		if _, err := os.Stat(filepath.Join(root, "berth-"+d.Instance)); err == nil {
			out = append(out, "cgroup parent "+filepath.Join(root, "berth-"+d.Instance))
		}
	}
	return out
}

func nftTableExists(table string) bool {
	b, err := exec.Command("nft", "list", "tables", "inet").Output()
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[2] == table {
			return true
		}
	}
	return false
}

// nftSandboxEntries lists the per-sandbox objects in the instance's table:
// sandbox chains and the interface map's elements.
func nftSandboxEntries(d *Daemon) []string {
	b, err := exec.Command("nft", "list", "table", "inet", d.NftTable()).Output()
	if err != nil {
		return nil // no table, nothing in it
	}
	var out []string
	linkPrefix := `"b` + d.Instance + `-`
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(line, "chain sbx-"):
			out = append(out, "nftables "+strings.TrimSuffix(line, " {"))
		case strings.Contains(line, ": jump "):
			// map elements: "elements = { "bX-…" : jump sbx-…," or a
			// continuation line holding the same.
			for _, el := range strings.Split(line, ",") {
				if i := strings.Index(el, linkPrefix); i >= 0 {
					out = append(out, "nftables map element "+strings.Trim(el[i:], " }"))
				}
			}
		}
	}
	return out
}

// Leaks lists what is left on the host of the daemon's sandboxes.
func Leaks(d *Daemon) []string {
	out := nftSandboxEntries(d)
	if mounts, err := mountinfo.GetMounts(nil); err == nil {
		for _, m := range mounts {
			if strings.HasPrefix(m.Mountpoint, d.DataDir+"/") || strings.Contains(m.Mountpoint, d.Instance) {
				out = append(out, "mount "+m.Mountpoint)
			}
		}
	}
	if ents, err := os.ReadDir("/var/run/netns"); err == nil {
		for _, e := range ents {
			if strings.Contains(e.Name(), d.Instance) {
				out = append(out, "netns "+e.Name())
			}
		}
	}
	// Address reservations (hostnet's reserve_linux.go): one per attached
	// sandbox, named <addr>_<instance>_<id>.
	if ents, err := os.ReadDir("/run/berth/netpool.lock.d"); err == nil {
		for _, e := range ents {
			if strings.Contains(e.Name(), "_"+d.Instance+"_") {
				out = append(out, "address reservation "+e.Name())
			}
		}
	}
	if b, err := exec.Command("ip", "-o", "link", "show").Output(); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if strings.Contains(line, d.Instance) {
				out = append(out, "link "+strings.TrimSpace(line))
			}
		}
	}
	// Every sandbox process lives in a cgroup under the daemon's parent,
	// which nothing inside can leave (cgroupfs is read-only there).
	for _, p := range Procs(func(p Proc) bool { return strings.Contains(p.Cgroup, "/berth-"+d.Instance+"/") }) {
		out = append(out, "process "+strconv.Itoa(p.PID)+" "+p.Cmdline)
	}
	out = append(out, userNSHolders(d)...)
	for _, root := range cgroupRoots {
		dir := filepath.Join(root, "berth-"+d.Instance)
		if ents, err := os.ReadDir(dir); err == nil {
			for _, e := range ents {
				if e.IsDir() {
					out = append(out, "cgroup "+filepath.Join(dir, e.Name()))
				}
			}
		}
	}
	// Each isolation level keeps its runtime state and sandbox dirs apart:
	// runc under the data dir, gVisor under gvisor/.
	for _, lvl := range []struct{ name, dir string }{{"runc", d.DataDir}, {"gvisor", filepath.Join(d.DataDir, "gvisor")}} {
		root := "runc"
		if lvl.name == "gvisor" {
			root = "runsc"
		}
		if ents, err := os.ReadDir(filepath.Join(lvl.dir, root)); err == nil {
			for _, e := range ents {
				out = append(out, lvl.name+" runtime state "+e.Name())
			}
		}
		if ents, err := os.ReadDir(filepath.Join(lvl.dir, "sandboxes")); err == nil {
			for _, e := range ents {
				out = append(out, lvl.name+" sandbox dir "+e.Name())
			}
		}
	}
	// gVisor's gofer is not always in the sandbox's cgroup: any runsc
	// process still naming this daemon's runsc root is a leak.
	gvRoot := filepath.Join(d.DataDir, "gvisor", "runsc")
	for _, p := range Procs(func(p Proc) bool { return strings.Contains(p.Cmdline, gvRoot) }) {
		out = append(out, "gvisor process "+strconv.Itoa(p.PID)+" "+p.Cmdline)
	}
	if ents, err := os.ReadDir(filepath.Join(d.DataDir, "checkpoints")); err == nil {
		for _, e := range ents {
			out = append(out, "checkpoint "+e.Name())
		}
	}
	out = append(out, UIDClaims(d)...)
	out = append(out, snapshotLeaks(d)...)
	return out
}

// PausedLeaks lists what is left on the host of the daemon's sandboxes
// beyond what the paused ones may hold: their sandbox dir (the disk image
// with the writable layer), their uid range claim and, for a memory
// pause, their checkpoint. A mount, loop-backed disk, network namespace,
// link, nftables entry, cgroup or process of a paused sandbox is a leak.
func PausedLeaks(d *Daemon, paused ...string) []string {
	var out []string
next:
	for _, l := range Leaks(d) {
		for _, id := range paused {
			// Sandbox dirs are named by isolation level ("runc sandbox
			// dir ID", "gvisor sandbox dir ID").
			if strings.HasSuffix(l, " sandbox dir "+id) || l == "checkpoint "+id ||
				(strings.HasPrefix(l, "uid range claim ") && strings.HasSuffix(l, "("+id+")")) {
				continue next
			}
		}
		out = append(out, l)
	}
	return out
}

// AssertPausedClean fails t on PausedLeaks.
func AssertPausedClean(t TB, d *Daemon, paused ...string) {
	t.Helper()
	for _, l := range PausedLeaks(d, paused...) {
		t.Errorf("leak while paused: %s", l)
	}
}

// userNSHolders lists the daemon's children that hold a sandbox's user
// namespace (unshare, then cat, run as the sandbox's root uid): each must
// be gone once runc has joined the namespace or the create failed.
func userNSHolders(d *Daemon) []string {
	pid := d.PID()
	if pid == 0 {
		// A holder exits when the daemon does (its stdin closes).
		return nil
	}
	var out []string
	for _, p := range Procs(func(p Proc) bool {
		return p.PPID == pid && (p.Comm == "cat" || p.Comm == "unshare")
	}) {
		out = append(out, "user namespace holder "+strconv.Itoa(p.PID))
	}
	return out
}

// SlotDir is where daemons claim sandbox host uid ranges (runc.Config
// SlotDir's default).
const SlotDir = "/run/berth/uid-slots"

// UIDClaims lists the daemon's claims on host uid ranges: one file per
// live sandbox, naming the daemon's state dir and the sandbox.
func UIDClaims(d *Daemon) []string {
	var out []string
	ents, _ := os.ReadDir(SlotDir)
	for _, stateDir := range []string{filepath.Join(d.DataDir, "sandboxes"), filepath.Join(d.DataDir, "gvisor", "sandboxes")} {
		owner := stateDir + "\n"
		for _, e := range ents {
			b, err := os.ReadFile(filepath.Join(SlotDir, e.Name()))
			if err == nil && strings.HasPrefix(string(b), owner) {
				out = append(out, "uid range claim "+e.Name()+" ("+strings.TrimSpace(strings.TrimPrefix(string(b), owner))+")")
			}
		}
	}
	return out
}

// FirstOutput is an io.Writer whose channel C closes at the first byte
// written: the event that a command printed something.
type FirstOutput struct {
	C    chan struct{}
	once sync.Once
}

// NewFirstOutput returns a FirstOutput with C open.
func NewFirstOutput() *FirstOutput { return &FirstOutput{C: make(chan struct{})} }

func (f *FirstOutput) Write(p []byte) (int, error) {
	if len(p) > 0 {
		f.once.Do(func() { close(f.C) })
	}
	return len(p), nil
}

// Each runs fn on every item, at most n at a time, and fails the test
// (t.Errorf) with each error fn returns, prefixed by the item. Tests that
// check or tear down many sandboxes use it: one at a time, their waits
// add up to minutes.
func Each[T any](t TB, n int, items []T, fn func(T) error) {
	t.Helper()
	sem := make(chan struct{}, max(n, 1))
	var wg sync.WaitGroup
	for _, it := range items {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if err := fn(it); err != nil {
				t.Errorf("%v: %v", it, err)
			}
		})
	}
	wg.Wait()
}

// StartUDPEcho puts bin's UDP echo server into sb, starts it on port and
// waits until the sandbox shows it listening (busybox netstat).
func StartUDPEcho(t TB, bin Binaries, sb *client.Sandbox, port int) {
	t.Helper()
	StartEcho(t, bin, sb, port, 0)
}

// StartEcho is StartUDPEcho with the server also echoing TCP on tcpPort
// (none when 0).
func StartEcho(t TB, bin Binaries, sb *client.Sandbox, udpPort, tcpPort int) {
	t.Helper()
	f, err := os.Open(bin.UDPEcho)
	if err != nil {
		t.Fatalf("udpecho: %v", err)
	}
	defer f.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := sb.WriteFile(ctx, "/tmp/udpecho", f); err != nil {
		t.Fatalf("put udpecho into %s: %v", sb.ID, err)
	}
	args := fmt.Sprintf("-listen :%d", udpPort)
	if tcpPort > 0 {
		args += fmt.Sprintf(" -tcp :%d", tcpPort)
	}
	MustRun(t, sb, "chmod 755 /tmp/udpecho && (/tmp/udpecho "+args+" </dev/null >/tmp/udpecho.log 2>&1 &)")
	WaitFor(t, time.Minute, fmt.Sprintf("the echo server in %s to listen on %d", sb.ID, udpPort), func() bool {
		out, _, _ := Run(t, sb, "netstat -lun")
		if !strings.Contains(out, fmt.Sprintf(":%d ", udpPort)) {
			return false
		}
		if tcpPort == 0 {
			return true
		}
		out, _, _ = Run(t, sb, "netstat -ltn")
		return strings.Contains(out, fmt.Sprintf(":%d ", tcpPort))
	})
}
