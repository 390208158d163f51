package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/internal/template"
	"github.com/berth-sandbox/berth/test/harness"
)

// measureBurst starts `burst` creates of the minimal template at once and
// returns each one's latency (request to ready) and the burst's rate.
// Every create must succeed: a burst with failures measures nothing.
func measureBurst(ctx context.Context, d *harness.Daemon, burst int) ([]time.Duration, float64, error) {
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		lat  []time.Duration
		ids  []string
		errs []error
	)
	stopProfile := startBurstProfile(d)
	start := time.Now()
	for range burst {
		wg.Go(func() {
			t0 := time.Now()
			sb, err := d.Client.Create(ctx, client.CreateRequest{Template: "minimal"})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			lat = append(lat, time.Since(t0))
			ids = append(ids, sb.ID)
		})
	}
	wg.Wait()
	rate := float64(len(ids)) / time.Since(start).Seconds()
	stopProfile()
	for _, id := range ids {
		if err := d.Client.Kill(ctx, id); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return nil, 0, fmt.Errorf("burst of %d creates: %d failed, first: %w", burst, len(errs), errs[0])
	}
	return lat, rate, nil
}

// measureRawRuncBurst is measureBurst's floor: `burst` raw `runc run`s of
// the minimal template's rootfs at once, each printing `ok` and exiting.
func measureRawRuncBurst(ctx context.Context, d *harness.Daemon, burst int) ([]time.Duration, float64, error) {
	store, err := template.New(template.Config{DataDir: d.DataDir, CacheDir: harness.CacheDir(), UIDBase: 1_000_000})
	if err != nil {
		return nil, 0, err
	}
	t, err := store.Get(ctx, "minimal")
	if err != nil {
		return nil, 0, err
	}
	dir, err := os.MkdirTemp("", "berth-bench-burst-")
	if err != nil {
		return nil, 0, err
	}
	defer os.RemoveAll(dir)
	b, _ := json.Marshal(rawSpec(t.Layers[len(t.Layers)-1]))
	if err := os.WriteFile(filepath.Join(dir, "config.json"), b, 0o600); err != nil {
		return nil, 0, err
	}
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		lat  []time.Duration
		errs []error
	)
	start := time.Now()
	for i := range burst {
		wg.Go(func() {
			var errb bytes.Buffer
			id := fmt.Sprintf("berth-bench-burst-%d-%d", os.Getpid(), i)
			cmd := exec.CommandContext(ctx, "runc", "--root", filepath.Join(dir, "state"), "run", "--bundle", dir, id)
			cmd.Stderr = &errb
			t0 := time.Now()
			err := cmd.Run()
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, fmt.Errorf("runc run: %v: %s", err, errb.String()))
				return
			}
			lat = append(lat, time.Since(t0))
		})
	}
	wg.Wait()
	rate := float64(len(lat)) / time.Since(start).Seconds()
	if len(errs) > 0 {
		return nil, 0, fmt.Errorf("raw runc burst: %d failed, first: %w", len(errs), errs[0])
	}
	return lat, rate, nil
}

// burstProfileDir is -pprof: where the burst's daemon profiles go.
var burstProfileDir string

// startBurstProfile starts a CPU profile of the daemon through its local
// socket's /debug/pprof/ and returns what stops it: it waits for the CPU
// profile (which runs pprofSeconds) and then saves the mutex, block and
// goroutine profiles next to it. Errors are printed, not fatal: the
// profile is a diagnosis, the rows are the measurement.
func startBurstProfile(d *harness.Daemon) func() {
	if burstProfileDir == "" {
		return func() {}
	}
	const pprofSeconds = 10
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var dl net.Dialer
		return dl.DialContext(ctx, "unix", filepath.Join(d.DataDir, "berth.sock"))
	}}}
	save := func(name, query string) {
		resp, err := hc.Get("http://berth/debug/pprof/" + name + query)
		if err != nil {
			fmt.Fprintf(os.Stderr, "bench: profile %s: %v\n", name, err)
			return
		}
		defer resp.Body.Close()
		f, err := os.Create(filepath.Join(burstProfileDir, name+".pprof"))
		if err != nil {
			fmt.Fprintf(os.Stderr, "bench: profile %s: %v\n", name, err)
			return
		}
		defer f.Close()
		if _, err := io.Copy(f, resp.Body); err != nil {
			fmt.Fprintf(os.Stderr, "bench: profile %s: %v\n", name, err)
		}
	}
	if err := os.MkdirAll(burstProfileDir, 0o755); err != nil {
		fmt.Fprintf(os.Stderr, "bench: %v\n", err)
		return func() {}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		save("profile", fmt.Sprintf("?seconds=%d", pprofSeconds))
	}()
	return func() {
		<-done
		save("mutex", "")
		save("block", "")
		save("goroutine", "")
	}
}
