// Command bench measures Berth against its floor, side by side in one run,
// and prints a Markdown table of medians and p99s:
//
//   - time to interactive (TTI): from the create request to the first byte
//     of `echo ok` output in the new sandbox, per template, against a raw
//     `runc run` of the same root filesystem printing the same;
//   - exec round trip on a running sandbox (start `true`, wait for its end
//     through the daemon's API) against a direct fork/exec on the host;
//   - E2B compatibility: Sandbox.create → result of the first
//     commands.run('echo ok') through the official npm e2b SDK
//     (bench/e2b_tti.cjs, needs `npm ci` in test/e2b) against the same flow
//     through the native Go SDK, on the base template;
//   - burst: -burst creates of the minimal template at once (latency of
//     each, and creates per second), against the same number of raw
//     `runc run`s of its rootfs at once.
//
// With -density N it instead holds N idle minimal sandboxes on one daemon
// (created -density-batch at a time), checks each answers, and reports
// sandboxes held and host memory per sandbox (bench/density.go).
//
// With -pause N it instead pauses and resumes one sandbox holding
// -pause-mib MiB N times (bench/pause.go).
//
// With -template-build N it instead builds one Dockerfile N times through
// the daemon and with Debian's buildah, cold and cached, and compares the
// TTI of the built template with base's (bench/templatebuild.go).
//
// With -runtimes it instead measures at the runtime level, runc and gVisor
// side by side: raw `runc run` / `runsc run` floors, runtime Create →
// agent ready, exec round trip and memory per idle sandbox
// (bench/gvisor.go).
//
// Run as root: go run ./bench [-n 50] [-exec-n 200] [-burst 50] [-templates minimal,base] [-e2b=true]
// or: go run ./bench -density 500 [-density-batch 25]
// or: go run ./bench -runtimes [-n 20] [-exec-n 50]
// or: go run ./bench -pause 10 [-pause-mib 256]
// or: go run ./bench -snapshot 5 [-snapshot-mib 64] [-snapshot-isolation gvisor]
// or: go run ./bench -template-build 5
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/internal/template"
	"github.com/berth-sandbox/berth/test/harness"
)

func main() {
	n := flag.Int("n", 50, "sandboxes per template")
	execN := flag.Int("exec-n", 200, "exec round trips")
	templates := flag.String("templates", "minimal,base", "templates to measure")
	burst := flag.Int("burst", 50, "concurrent creates in the burst row (0: skip)")
	e2b := flag.Bool("e2b", true, "also measure the E2B SDK flow (needs node and `npm ci` in test/e2b)")
	density := flag.Int("density", 0, "instead of the latency rows, hold this many idle minimal sandboxes and report memory per sandbox")
	batch := flag.Int("density-batch", 25, "sandboxes created concurrently in the density run")
	flag.DurationVar(&idleWindow, "density-idle", idleWindow, "how long the density run watches the host's CPU, before the sandboxes and with them idle")
	isolation := flag.String("isolation", "runc", "isolation level of the daemon-level and density rows (runc or gvisor; the floor is then raw `runsc run`)")
	runtimes := flag.Bool("runtimes", false, "instead, runtime-level rows for runc and gVisor side by side (bench/gvisor.go)")
	pause := flag.Int("pause", 0, "instead, this many pause/resume rounds of a sandbox holding -pause-mib MiB (bench/pause.go)")
	pauseMiB := flag.Int("pause-mib", 256, "memory the paused sandbox's process holds")
	snapshot := flag.Int("snapshot", 0, "instead, this many rounds of snapshot, create-from-snapshot and fork of a sandbox that wrote -snapshot-mib MiB (bench/snapshot.go)")
	templateBuild := flag.Int("template-build", 0, "instead, this many rounds of a Dockerfile build through the daemon next to `buildah bud` (bench/templatebuild.go)")
	snapshotMiB := flag.Int("snapshot-mib", 64, "file data the snapshotted sandbox wrote")
	snapshotIso := flag.String("snapshot-isolation", "runc", "isolation level of the snapshotted sandbox (gvisor: memory snapshots where runsc can; the sandbox also holds -snapshot-mib MiB in memory)")
	park := flag.Int("park", 0, "instead, a fleet of this many sandboxes, each holding -park-mib MiB, paused and resumed all at once and one at a time (bench/park.go)")
	parkMiB := flag.Int("park-mib", 64, "memory each parked sandbox's process holds")
	parkIso := flag.String("park-isolation", "gvisor", "isolation level of the parked fleet")
	pauseIsolations := flag.String("pause-isolations", "runc,gvisor", "isolation levels of the pause rows, one table each in the same run")
	only := flag.String("rows", "tti,exec,warm,burst,tunnel,e2b", "which of the latency rows to measure")
	pprofDir := flag.String("pprof", "", "write the daemon's CPU profile (and, with BERTH_PROFILE_CONTENTION=1, mutex and block profiles) during the burst here")
	flag.Parse()
	rowSet = map[string]bool{}
	for _, r := range strings.Split(*only, ",") {
		rowSet[strings.TrimSpace(r)] = true
	}
	burstProfileDir = *pprofDir
	tb := &runner{}
	defer tb.finish()
	if *templateBuild > 0 {
		if err := runTemplateBuild(tb, *templateBuild); err != nil {
			tb.Fatalf("%v", err)
		}
		return
	}
	if *snapshot > 0 {
		if err := runSnapshot(tb, *snapshot, *snapshotMiB, *snapshotIso); err != nil {
			tb.Fatalf("%v", err)
		}
		return
	}
	if *park > 0 {
		if err := runPark(tb, *park, *parkMiB, *parkIso); err != nil {
			tb.Fatalf("%v", err)
		}
		return
	}
	if *pause > 0 {
		if err := runPause(tb, *pause, *pauseMiB, strings.Split(*pauseIsolations, ",")); err != nil {
			tb.Fatalf("%v", err)
		}
		return
	}
	if *runtimes {
		if err := runRuntimes(*n, *execN); err != nil {
			tb.Fatalf("%v", err)
		}
		return
	}
	if *density > 0 {
		if err := runDensity(tb, *density, *batch, *isolation); err != nil {
			tb.Fatalf("%v", err)
		}
		return
	}
	if err := run(tb, *n, *execN, *burst, strings.Split(*templates, ","), *e2b, *isolation); err != nil {
		tb.Fatalf("%v", err)
	}
}

func run(tb *runner, n, execN, burst int, templates []string, e2b bool, iso string) error {
	// Debug logging gives the create phases (bench/phases.go).
	d, cleanup, err := startDaemon(tb, "--debug")
	if err != nil {
		return err
	}
	defer cleanup()
	ctx := context.Background()
	var rows []row
	var phases []row
	for _, name := range templates {
		if name == "" {
			continue
		}
		if _, err := d.Client.BuildTemplate(ctx, name, io.Discard); err != nil {
			return fmt.Errorf("build template %s: %w", name, err)
		}
		if !rowSet["tti"] {
			continue
		}
		// Each Berth create alternates with one raw run of the floor, so
		// a machine whose speed drifts during the run (this VM's does,
		// by a third from one minute to the next) moves both alike.
		floor, rawRun := "runc", measureRawRunc
		if iso == client.IsolationGVisor {
			floor, rawRun = "runsc", measureRawRunsc
		}
		logStart := len(d.Logs())
		var tti, raw []time.Duration
		for range n {
			one, err := measureTTI(ctx, d, name, 1, iso)
			if err != nil {
				return err
			}
			tti = append(tti, one...)
			if one, err = rawRun(ctx, d, name, 1); err != nil {
				return err
			}
			raw = append(raw, one...)
		}
		for _, r := range phaseRows(d.Logs()[logStart:], createPhases) {
			r.name = name + ", " + r.name
			phases = append(phases, r)
		}
		rows = append(rows,
			row{"TTI, template " + name + ", isolation " + iso + " (create → first byte of `echo ok`)", tti},
			row{"floor: raw `" + floor + " run` of the same rootfs → first byte of `echo ok`", raw})
	}
	if rowSet["exec"] {
		rtt, err := measureExec(ctx, d, execN, iso)
		if err != nil {
			return err
		}
		fork, err := measureFork(execN)
		if err != nil {
			return err
		}
		rows = append(rows,
			row{"exec round trip (`true` through the daemon API), isolation " + iso, rtt},
			row{"floor: fork/exec of `true` on the host", fork})
	}
	if iso == client.IsolationRunc && rowSet["warm"] {
		logStart := len(d.Logs())
		warm, plain, err := measureWarm(ctx, d, n)
		if err != nil {
			return err
		}
		for _, r := range phaseRows(d.Logs()[logStart:], claimPhases) {
			r.name = "warm claim: " + r.name
			phases = append(phases, r)
		}
		rows = append(rows,
			row{"warm create, template minimal (pool claim → first byte of `echo ok`)", warm},
			row{"floor: `echo ok` on a running sandbox → first byte", plain})
	}
	if burst > 0 && rowSet["burst"] {
		lat, rate, err := measureBurst(ctx, d, burst)
		if err != nil {
			return err
		}
		raw, rawRate, err := measureRawRuncBurst(ctx, d, burst)
		if err != nil {
			return err
		}
		rows = append(rows,
			row{fmt.Sprintf("burst: %d concurrent creates, minimal (%.1f creates/s)", burst, rate), lat},
			row{fmt.Sprintf("floor: %d concurrent raw `runc run`s of its rootfs (%.1f runs/s)", burst, rawRate), raw})
	}
	if rowSet["tunnel"] {
		rs, err := measureTunnels(ctx, tb, d, execN)
		if err != nil {
			return err
		}
		rows = append(rows, rs...)
	}
	if e2b && rowSet["e2b"] {
		rs, err := measureE2B(ctx, d, n)
		if err != nil {
			return err
		}
		rows = append(rows, rs...)
	}
	fmt.Printf("\n| measurement | n | p50 | p99 |\n|---|---|---|---|\n")
	for _, r := range rows {
		fmt.Printf("| %s | %d | %s | %s |\n", r.name, len(r.samples), fmtDur(pct(r.samples, 50)), fmtDur(pct(r.samples, 99)))
	}
	printPhases("where a TTI or warm row's create goes (daemon debug log)", phases)
	return nil
}

// rowSet is -rows: the latency rows to measure.
var rowSet map[string]bool

type row struct {
	name    string
	samples []time.Duration
}

// firstByte is a writer that records when its first byte arrived.
type firstByte struct {
	once sync.Once
	at   time.Time
	ch   chan struct{}
}

func newFirstByte() *firstByte { return &firstByte{ch: make(chan struct{})} }

func (f *firstByte) Write(p []byte) (int, error) {
	if len(p) > 0 {
		f.once.Do(func() { f.at = time.Now(); close(f.ch) })
	}
	return len(p), nil
}

// startDaemon builds berth and starts a daemon of it with args; cleanup
// removes the build once the daemon is done with it.
func startDaemon(tb *runner, args ...string) (*harness.Daemon, func(), error) {
	bin, cleanup, err := harness.Build()
	if err != nil {
		return nil, nil, err
	}
	built = bin
	return harness.StartDaemon(tb, bin, args...), cleanup, nil
}

// built is what startDaemon built (the tunnel rows' echo server too).
var built harness.Binaries

func measureTTI(ctx context.Context, d *harness.Daemon, tpl string, n int, iso string) ([]time.Duration, error) {
	var out []time.Duration
	for i := 0; i < n; i++ {
		start := time.Now()
		sb, err := d.Client.Create(ctx, client.CreateRequest{Template: tpl, Isolation: iso})
		if err != nil {
			return nil, fmt.Errorf("create %s: %w", tpl, err)
		}
		fb := newFirstByte()
		code, err := sb.Exec(ctx, client.ExecRequest{Cmd: "echo", Args: []string{"ok"}, Stdout: fb})
		if err != nil || code != 0 {
			return nil, fmt.Errorf("echo ok in %s: %d %v", sb.ID, code, err)
		}
		out = append(out, fb.at.Sub(start))
		if err := d.Client.Kill(ctx, sb.ID); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// measureRawRunc runs `echo ok` with runc directly on the template's layer
// (read-only rootfs, same user namespace mapping): the floor under which
// no sandbox can start.
func measureRawRunc(ctx context.Context, d *harness.Daemon, tpl string, n int) ([]time.Duration, error) {
	store, err := template.New(template.Config{DataDir: d.DataDir, CacheDir: harness.CacheDir(), UIDBase: 1_000_000})
	if err != nil {
		return nil, err
	}
	t, err := store.Get(ctx, tpl)
	if err != nil {
		return nil, err
	}
	if len(t.Layers) != 1 {
		return nil, fmt.Errorf("template %s has %d layers; the raw floor needs one", tpl, len(t.Layers))
	}
	dir, err := os.MkdirTemp("", "berth-bench-runc-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	spec := rawSpec(t.Layers[0])
	b, _ := json.Marshal(spec)
	if err := os.WriteFile(filepath.Join(dir, "config.json"), b, 0o600); err != nil {
		return nil, err
	}
	root := filepath.Join(dir, "state")
	var out []time.Duration
	for i := 0; i < n; i++ {
		id := fmt.Sprintf("berth-bench-%d-%d", os.Getpid(), i)
		fb := newFirstByte()
		var errb bytes.Buffer
		cmd := exec.CommandContext(ctx, "runc", "--root", root, "run", "--bundle", dir, id)
		cmd.Stdout, cmd.Stderr = fb, &errb
		start := time.Now()
		if err := cmd.Run(); err != nil {
			return nil, fmt.Errorf("runc run: %v: %s", err, errb.String())
		}
		select {
		case <-fb.ch:
		default:
			return nil, fmt.Errorf("runc run printed nothing: %s", errb.String())
		}
		out = append(out, fb.at.Sub(start))
	}
	return out, nil
}

// measureRawRunsc is measureRawRunc's floor under gVisor: `runsc run` of
// the template's layer with no network.
func measureRawRunsc(ctx context.Context, d *harness.Daemon, tpl string, n int) ([]time.Duration, error) {
	store, err := template.New(template.Config{DataDir: d.DataDir, CacheDir: harness.CacheDir(), UIDBase: 1_000_000})
	if err != nil {
		return nil, err
	}
	t, err := store.Get(ctx, tpl)
	if err != nil {
		return nil, err
	}
	if len(t.Layers) != 1 {
		return nil, fmt.Errorf("template %s has %d layers; the raw floor needs one", tpl, len(t.Layers))
	}
	return measureRaw(ctx, "runsc", t.Layers[0], n)
}

func rawSpec(rootfs string) *specs.Spec {
	ids := []specs.LinuxIDMapping{{ContainerID: 0, HostID: 1_000_000, Size: 65536}}
	return &specs.Spec{
		Version: specs.Version,
		Root:    &specs.Root{Path: rootfs, Readonly: true},
		Process: &specs.Process{
			Args:            []string{"/bin/echo", "ok"},
			Env:             []string{"PATH=/usr/bin:/bin"},
			Cwd:             "/",
			NoNewPrivileges: true,
		},
		Hostname: "bench",
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc"},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		},
		Linux: &specs.Linux{
			UIDMappings: ids,
			GIDMappings: ids,
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace}, {Type: specs.NetworkNamespace}, {Type: specs.IPCNamespace},
				{Type: specs.UTSNamespace}, {Type: specs.MountNamespace}, {Type: specs.UserNamespace},
			},
		},
	}
}

func measureExec(ctx context.Context, d *harness.Daemon, n int, iso string) ([]time.Duration, error) {
	sb, err := d.Client.Create(ctx, client.CreateRequest{Template: "minimal", Isolation: iso})
	if err != nil {
		return nil, err
	}
	defer func() { _ = d.Client.Kill(ctx, sb.ID) }()
	var out []time.Duration
	for i := 0; i < n+5; i++ {
		start := time.Now()
		code, err := sb.Exec(ctx, client.ExecRequest{Cmd: "true"})
		if err != nil || code != 0 {
			return nil, fmt.Errorf("exec true: %d %v", code, err)
		}
		if i >= 5 { // the first few warm the connection pool
			out = append(out, time.Since(start))
		}
	}
	return out, nil
}

func measureFork(n int) ([]time.Duration, error) {
	var out []time.Duration
	for i := 0; i < n; i++ {
		start := time.Now()
		if err := exec.Command("/bin/true").Run(); err != nil {
			return nil, err
		}
		out = append(out, time.Since(start))
	}
	return out, nil
}

// pct is the p-th percentile of s (nearest rank).
func pct(s []time.Duration, p int) time.Duration { return harness.Quantile(s, p) }

func fmtDur(d time.Duration) string {
	if d < time.Millisecond {
		// Round trips on the host: a tenth of a millisecond says too little.
		return fmt.Sprintf("%d µs", d.Microseconds())
	}
	return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000)
}

// runner lets the harness report to a program instead of a test.
type runner struct {
	mu       sync.Mutex
	cleanups []func()
	failed   bool
}

func (r *runner) Helper() {}
func (r *runner) Fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "bench: "+format+"\n", args...)
	r.failed = true
	r.finish()
	os.Exit(1)
}
func (r *runner) Errorf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "bench: "+format+"\n", args...)
	r.failed = true
}
func (r *runner) Logf(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }
func (r *runner) Skip(args ...any)                { r.Fatalf("%s", fmt.Sprint(args...)) }
func (r *runner) Cleanup(f func()) {
	r.mu.Lock()
	r.cleanups = append(r.cleanups, f)
	r.mu.Unlock()
}
func (r *runner) TempDir() string {
	d, err := os.MkdirTemp("", "berth-bench-")
	if err != nil {
		r.Fatalf("%v", err)
	}
	r.Cleanup(func() { os.RemoveAll(d) })
	return d
}
func (r *runner) Failed() bool { return r.failed }

func (r *runner) finish() {
	r.mu.Lock()
	cs := r.cleanups
	r.cleanups = nil
	r.mu.Unlock()
	for i := len(cs) - 1; i >= 0; i-- {
		cs[i]()
	}
}
