package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/test/harness"
)

// measureE2B times create → first `echo ok` result through the npm e2b SDK
// and through the native Go SDK, both on the base template, in this run.
func measureE2B(ctx context.Context, d *harness.Daemon, n int) ([]row, error) {
	if _, err := d.Client.BuildTemplate(ctx, "base", io.Discard); err != nil {
		return nil, fmt.Errorf("build template base: %w", err)
	}
	native, err := measureNativeRun(ctx, d, n)
	if err != nil {
		return nil, err
	}
	node, err := exec.LookPath("node")
	if err != nil {
		return nil, fmt.Errorf("the E2B measurement needs node (or pass -e2b=false): %w", err)
	}
	root, err := os.Getwd()
	if err != nil {
		return nil, err
	}
	mods := filepath.Join(root, "test", "e2b", "node_modules")
	if _, err := os.Stat(filepath.Join(mods, "e2b")); err != nil {
		return nil, fmt.Errorf("run `npm ci` in test/e2b first (or pass -e2b=false): %w", err)
	}
	key, err := d.Client.CreateAPIKey(ctx, "bench")
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, node, filepath.Join(root, "bench", "e2b_tti.cjs"), fmt.Sprint(n), "base")
	cmd.Env = append(os.Environ(), "NODE_PATH="+mods, "E2B_API_URL="+d.URL, "E2B_SANDBOX_URL="+d.URL,
		"E2B_API_KEY="+key.Key, "E2B_DOMAIN=berth.localhost")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("bench/e2b_tti.cjs: %w\n%s", err, stderr.String())
	}
	var res struct {
		DurationsMS []float64 `json:"durations_ms"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		return nil, fmt.Errorf("bench/e2b_tti.cjs printed %q: %w", out, err)
	}
	sdk := make([]time.Duration, 0, len(res.DurationsMS))
	for _, ms := range res.DurationsMS {
		sdk = append(sdk, time.Duration(ms*float64(time.Millisecond)))
	}
	return []row{
		{"E2B JS SDK: `Sandbox.create('base')` → `commands.run('echo ok')` result", sdk},
		{"native Go SDK: create base → `echo ok` result", native},
	}, nil
}

// measureNativeRun is the Go SDK's side of the E2B comparison: create, run
// `echo ok` to its end, kill.
func measureNativeRun(ctx context.Context, d *harness.Daemon, n int) ([]time.Duration, error) {
	var out []time.Duration
	for i := 0; i < n; i++ {
		start := time.Now()
		sb, err := d.Client.Create(ctx, client.CreateRequest{Template: "base"})
		if err != nil {
			return nil, fmt.Errorf("create base: %w", err)
		}
		var stdout bytes.Buffer
		code, err := sb.Exec(ctx, client.ExecRequest{Cmd: "echo", Args: []string{"ok"}, Stdout: &stdout})
		if err != nil || code != 0 || stdout.String() != "ok\n" {
			return nil, fmt.Errorf("echo ok in %s: %d %q %v", sb.ID, code, stdout.String(), err)
		}
		out = append(out, time.Since(start))
		if err := d.Client.Kill(ctx, sb.ID); err != nil {
			return nil, err
		}
	}
	return out, nil
}
