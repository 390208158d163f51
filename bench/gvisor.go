package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/berth-sandbox/berth/internal/runtime"
	"github.com/berth-sandbox/berth/internal/runtime/runc"
	"github.com/berth-sandbox/berth/internal/runtime/runsc"
)

// runRuntimes is the -runtimes mode: runtime-level rows for runc and
// gVisor side by side, until the daemon can choose gVisor (issue #13):
//
//   - floors: raw `runc run` and raw `runsc run` of a busybox root
//     filesystem printing `echo ok`, to its first byte;
//   - create → agent ready: the runtime backend's Create with a minimal
//     static agent (it writes a marker file and sleeps), then the marker
//     read through the runtime's own exec (`runc exec` / `runsc exec`), to
//     the first byte of its content;
//   - exec round trip: `true` through the runtime's exec on a running
//     sandbox;
//   - memory per idle sandbox: the host memory cgroup of each of n idle
//     sandboxes (gVisor: sentry + gofer + the sandbox's processes).
func runRuntimes(n, execN int) error {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "berth-bench-rt-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if err := os.Chmod(dir, 0o755); err != nil {
		return err
	}
	layer := filepath.Join(dir, "layer")
	if err := busyboxRootfs(layer, 1_000_000); err != nil {
		return err
	}
	agent, err := buildIdleAgent(ctx, dir)
	if err != nil {
		return err
	}
	var rows []row
	for _, bin := range []string{"runc", "runsc"} {
		raw, err := measureRaw(ctx, bin, layer, n)
		if err != nil {
			return err
		}
		rows = append(rows, row{fmt.Sprintf("floor: raw `%s run` of a busybox rootfs → first byte of `echo ok`", bin), raw})
	}
	rc, err := runc.New(runc.Config{StateDir: filepath.Join(dir, "runc-state"), RuncRoot: filepath.Join(dir, "runc-root"), CgroupParent: "berth-bench-runc"})
	if err != nil {
		return err
	}
	defer rc.Close()
	gv, err := runsc.New(ctx, runsc.Config{StateDir: filepath.Join(dir, "runsc-state"), RunscRoot: filepath.Join(dir, "runsc-root"), CgroupParent: "berth-bench-runsc"})
	if err != nil {
		return err
	}
	defer gv.Close()
	fmt.Fprintf(os.Stderr, "gvisor: runsc %s, platform %s\n", gv.Version(), gv.Platform())
	backends := []struct {
		name, bin, root, cgroup string
		b                       benchBackend
	}{
		{"runc", "runc", filepath.Join(dir, "runc-root"), "berth-bench-runc", rc},
		{"gvisor", "runsc", filepath.Join(dir, "runsc-root"), "berth-bench-runsc", gv},
	}
	// Whatever happens, created sandboxes are destroyed before the
	// deferred RemoveAll of dir runs (defers run last-in first-out), so it
	// never walks into a live mount.
	type made struct {
		b  benchBackend
		id string
	}
	var live []made
	defer func() {
		for _, m := range live {
			if err := m.b.Destroy(context.WithoutCancel(ctx), m.id); err != nil {
				fmt.Fprintf(os.Stderr, "destroy %s: %v\n", m.id, err)
			}
		}
	}()
	var mem []string
	for _, be := range backends {
		spec := func(id string) runtime.Spec {
			return runtime.Spec{ID: id, Layers: []string{layer}, DiskBytes: 64 << 20, CPUMillis: 1000,
				MemoryBytes: 256 << 20, PidsLimit: 256, Hostname: id, AgentPath: agent}
		}
		exe := func(ctx context.Context, id string, w *firstByte, argv ...string) error {
			cmd := exec.CommandContext(ctx, be.bin, append([]string{"--root", be.root, "exec", id}, argv...)...)
			var errb bytes.Buffer
			cmd.Stderr = &errb
			if w != nil {
				cmd.Stdout = w
			}
			if err := cmd.Run(); err != nil {
				return fmt.Errorf("%s exec: %w: %s", be.bin, err, errb.String())
			}
			return nil
		}
		var ready []time.Duration
		var ids []string
		for i := 0; i < n; i++ {
			// Same-length ids: runsc looks ids up by prefix.
			id := fmt.Sprintf("bench%d%s%04d", os.Getpid(), be.name, i)
			fb := newFirstByte()
			start := time.Now()
			if err := be.b.Create(ctx, spec(id)); err != nil {
				return err
			}
			ids = append(ids, id)
			live = append(live, made{be.b, id})
			// The agent writes its marker once it runs; poll the marker
			// through exec, as a client would poll the agent.
			for {
				if err := exe(ctx, id, fb, "/bin/cat", "/tmp/agent-started"); err == nil {
					break
				}
				if time.Since(start) > time.Minute {
					return fmt.Errorf("%s: agent of %s not ready after a minute", be.name, id)
				}
			}
			ready = append(ready, fb.at.Sub(start))
		}
		// Idle memory: every sandbox is up; let each settle to idle by
		// reading after all are created.
		var total int64
		for _, id := range ids {
			total += cgroupMemory(be.cgroup + "/" + id)
		}
		mem = append(mem, fmt.Sprintf("| memory per idle sandbox, %s (host memory cgroup) | %d | %.1f MiB |", be.name, len(ids), float64(total)/float64(len(ids))/(1<<20)))
		var rtt []time.Duration
		for i := 0; i < execN+3; i++ {
			start := time.Now()
			if err := exe(ctx, ids[0], nil, "/bin/true"); err != nil {
				return err
			}
			if i >= 3 {
				rtt = append(rtt, time.Since(start))
			}
		}
		for _, id := range ids {
			if err := be.b.Destroy(ctx, id); err != nil {
				return err
			}
			live = live[1:]
		}
		rows = append(rows,
			row{fmt.Sprintf("%s: runtime Create → agent ready (marker read through `%s exec`)", be.name, be.bin), ready},
			row{fmt.Sprintf("%s: exec round trip (`%s exec … true`)", be.name, be.bin), rtt})
	}
	fmt.Printf("\n| measurement | n | p50 | p99 |\n|---|---|---|---|\n")
	for _, r := range rows {
		fmt.Printf("| %s | %d | %s | %s |\n", r.name, len(r.samples), fmtDur(pct(r.samples, 50)), fmtDur(pct(r.samples, 99)))
	}
	fmt.Printf("\n| measurement | n | mean |\n|---|---|---|\n")
	for _, m := range mem {
		fmt.Println(m)
	}
	return nil
}

type benchBackend interface {
	Create(ctx context.Context, spec runtime.Spec) error
	Destroy(ctx context.Context, id string) error
}

// measureRaw times `bin run` of rootfs printing `echo ok`, n times, to
// the first byte of output.
func measureRaw(ctx context.Context, bin, rootfs string, n int) ([]time.Duration, error) {
	dir, err := os.MkdirTemp("", "berth-bench-raw-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	spec := rawSpec(rootfs)
	if bin == "runsc" {
		// runsc joins no network here: --network=none (the floor is the
		// sandbox, not its network).
		spec.Linux.Namespaces = slicesDeleteNet(spec.Linux.Namespaces)
	}
	b, _ := json.Marshal(spec)
	if err := os.WriteFile(filepath.Join(dir, "config.json"), b, 0o600); err != nil {
		return nil, err
	}
	root := filepath.Join(dir, "state")
	var out []time.Duration
	for i := 0; i < n; i++ {
		id := fmt.Sprintf("berth-bench-raw-%d-%d", os.Getpid(), i)
		fb := newFirstByte()
		var errb bytes.Buffer
		args := []string{"--root", root}
		if bin == "runsc" {
			args = append(args, "--network=none")
		}
		cmd := exec.CommandContext(ctx, bin, append(args, "run", "--bundle", dir, id)...)
		cmd.Stdout, cmd.Stderr = fb, &errb
		start := time.Now()
		if err := cmd.Run(); err != nil {
			return nil, fmt.Errorf("%s run: %v: %s", bin, err, errb.String())
		}
		select {
		case <-fb.ch:
		default:
			return nil, fmt.Errorf("%s run printed nothing: %s", bin, errb.String())
		}
		out = append(out, fb.at.Sub(start))
	}
	return out, nil
}

func slicesDeleteNet(ns []specs.LinuxNamespace) []specs.LinuxNamespace {
	var out []specs.LinuxNamespace
	for _, n := range ns {
		if n.Type != specs.NetworkNamespace {
			out = append(out, n)
		}
	}
	return out
}

// busyboxRootfs lays out a root filesystem of the host's static busybox
// in dir, owned by uid (the canonical range's root).
func busyboxRootfs(dir string, uid int) error {
	bb, err := exec.LookPath("busybox")
	if err != nil {
		return fmt.Errorf("busybox not installed (busybox-static): %w", err)
	}
	for _, d := range []string{"bin", "etc", "tmp", "proc", "sys", "dev", "root", "run"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return err
		}
	}
	if err := os.Chmod(filepath.Join(dir, "tmp"), 0o1777); err != nil {
		return err
	}
	b, err := os.ReadFile(bb)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "bin", "busybox"), b, 0o755); err != nil {
		return err
	}
	for _, a := range []string{"sh", "cat", "echo", "true", "sleep"} {
		if err := os.Symlink("busybox", filepath.Join(dir, "bin", a)); err != nil {
			return err
		}
	}
	return filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, uid)
	})
}

// idleAgent stands in for berth-agent: it marks that it runs and idles.
const idleAgent = `package main

import (
	"os"
	"time"
)

func main() {
	_ = os.WriteFile("/tmp/agent-started", []byte("ok\n"), 0o644)
	for {
		time.Sleep(time.Hour)
	}
}
`

func buildIdleAgent(ctx context.Context, dir string) (string, error) {
	src := filepath.Join(dir, "agent-src")
	if err := os.MkdirAll(src, 0o755); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(src, "main.go"), []byte(idleAgent), 0o644); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(src, "go.mod"), []byte("module idleagent\n\ngo 1.22\n"), 0o644); err != nil {
		return "", err
	}
	out := filepath.Join(dir, "idle-agent")
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags=-s -w", "-o", out, ".")
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOWORK=off")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build idle agent: %w: %s", err, b)
	}
	return out, os.Chmod(out, 0o755)
}
