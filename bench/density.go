package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/internal/meminfo"
)

// runDensity holds n idle sandboxes of template minimal on one daemon,
// created batch at a time, checks that every one answers, and reports how
// many it held and what they cost in host memory, measured two ways:
//
//   - sandboxes: the memory cgroup usage of the daemon's cgroup parent
//     (every sandbox's processes, page cache and kernel memory charged to
//     them) plus the growth of the daemon's own RSS; other work on the
//     host does not count here;
//   - host: the drop in MemAvailable over the whole run, which also counts
//     what is not charged to any cgroup (mounts, loop devices, network
//     namespaces and links, runc's short-lived processes) but also whatever
//     else the host did meanwhile.
func runDensity(tb *runner, n, batch int, iso string) error {
	d, cleanup, err := startDaemon(tb)
	if err != nil {
		return err
	}
	defer cleanup()
	ctx := context.Background()
	// One sandbox made and destroyed first: the daemon's caches, the
	// template and the disk pool are warm before the baseline.
	warm, err := d.Client.Create(ctx, client.CreateRequest{Template: "minimal", Isolation: iso})
	if err != nil {
		return err
	}
	if err := d.Client.Kill(ctx, warm.ID); err != nil {
		return err
	}
	// The host's CPU while nothing runs but the daemon (its monitor
	// included), the floor of the idle row below.
	idleBefore, err := busyCores(idleWindow)
	if err != nil {
		return err
	}
	availBefore, err := memAvailable()
	if err != nil {
		return err
	}
	rssBefore := rss(d.PID())
	var (
		sbs      []*client.Sandbox
		failures []string
		times    []time.Duration
	)
	start := time.Now()
	for len(sbs)+len(failures) < n {
		k := min(batch, n-len(sbs)-len(failures))
		var mu sync.Mutex
		var wg sync.WaitGroup
		for range k {
			wg.Add(1)
			go func() {
				defer wg.Done()
				t0 := time.Now()
				sb, err := d.Client.Create(ctx, client.CreateRequest{Template: "minimal", Timeout: "2h", Isolation: iso})
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					failures = append(failures, err.Error())
					return
				}
				times = append(times, time.Since(t0))
				sbs = append(sbs, sb)
			}()
		}
		wg.Wait()
		tb.Logf("density: %d created, %d failed, %s", len(sbs), len(failures), time.Since(start).Round(time.Second))
	}
	created := time.Since(start)
	// Every sandbox still answers, once all exist.
	// Answering: the exec ran and exited 0. Its output is counted apart
	// (a lost "ok" is an output bug, not a dead sandbox).
	answering, intact := 0, 0
	var notAnswering []string
	for _, sb := range sbs {
		var out bytes.Buffer
		code, err := sb.Exec(ctx, client.ExecRequest{Cmd: "echo", Args: []string{"ok"}, Stdout: &out})
		if err == nil && code == 0 {
			answering++
		}
		if strings.TrimSpace(out.String()) == "ok" {
			intact++
		} else {
			notAnswering = append(notAnswering, fmt.Sprintf("%s: exit %d, err %v, stdout %q", sb.ID, code, err, out.String()))
		}
	}
	// Nothing asked of them: what the daemon spends watching them (its
	// monitor samples each once a second) and what they spend idling.
	idleAfter, err := busyCores(idleWindow)
	if err != nil {
		return err
	}
	availAfter, err := memAvailable()
	if err != nil {
		return err
	}
	cg := cgroupMemory("berth-" + d.Instance)
	rssAfter := rss(d.PID())
	held := len(sbs)
	for _, f := range failures[:min(len(failures), 5)] {
		tb.Logf("density: create failed: %s", f)
	}
	for _, f := range notAnswering[:min(len(notAnswering), 5)] {
		tb.Logf("density: wrong answer: %s", f)
	}
	mib := func(b int64) float64 { return float64(b) / (1 << 20) }
	per := func(b int64) string {
		if held == 0 {
			return "-"
		}
		return fmt.Sprintf("%.2f MiB", mib(b)/float64(held))
	}
	fmt.Printf("\n| density (template minimal, isolation %s, %d at a time) | value |\n|---|---|\n", iso, batch)
	fmt.Printf("| sandboxes asked for | %d |\n", n)
	fmt.Printf("| sandboxes held (created) | %d |\n", held)
	fmt.Printf("| create failures | %d |\n", len(failures))
	fmt.Printf("| sandboxes answering (`echo ok` exits 0) after all were created | %d |\n", answering)
	fmt.Printf("| of those, with the `ok` output intact | %d |\n", intact)
	fmt.Printf("| time to create all | %s |\n", created.Round(time.Second))
	fmt.Printf("| create latency p50 / p99 (under %d-way concurrency) | %s / %s |\n", batch, fmtDur(pct(times, 50)), fmtDur(pct(times, 99)))
	fmt.Printf("| host memory per sandbox: sandbox cgroups + daemon RSS growth | %s (cgroups %.0f MiB, daemon RSS +%.0f MiB) |\n", per(cg+rssAfter-rssBefore), mib(cg), mib(rssAfter-rssBefore))
	fmt.Printf("| host memory per sandbox: MemAvailable drop | %s (%.0f MiB) |\n", per(availBefore-availAfter), mib(availBefore-availAfter))
	fmt.Printf("| host CPU over %s with the %d sandboxes idle (floor: the same window before them) | %.1f %% of a core (floor %.1f %%) |\n", idleWindow, held, 100*idleAfter, 100*idleBefore)
	if held > 0 {
		fmt.Printf("| host CPU per idle sandbox (over the floor) | %.2f %% of a core |\n", 100*(idleAfter-idleBefore)/float64(held))
	}
	t0 := time.Now()
	for _, sb := range sbs {
		if err := d.Client.Kill(ctx, sb.ID); err != nil {
			tb.Errorf("kill %s: %v", sb.ID, err)
		}
	}
	fmt.Printf("| time to destroy all (one at a time) | %s |\n", time.Since(t0).Round(time.Second))
	if len(failures) > 0 || answering != held {
		return fmt.Errorf("density: %d create failures, %d of %d answering", len(failures), answering, held)
	}
	return nil
}

// idleWindow is how long the density run watches the host's CPU with
// nothing asked of the daemon (-density-idle).
var idleWindow = 10 * time.Second

// busyCores is how many cores the host kept busy on average over window:
// the busy time /proc/stat counts (all but idle and iowait, in USER_HZ
// ticks) over the window's length.
func busyCores(window time.Duration) (float64, error) {
	busy := func() (float64, error) {
		b, err := os.ReadFile("/proc/stat")
		if err != nil {
			return 0, err
		}
		line, _, _ := strings.Cut(string(b), "\n")
		f := strings.Fields(line)
		if len(f) < 9 || f[0] != "cpu" {
			return 0, fmt.Errorf("/proc/stat: %q", line)
		}
		// user nice system idle iowait irq softirq steal (guest time is
		// in user and nice already).
		var n float64
		for i, v := range f[1:9] {
			x, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return 0, fmt.Errorf("/proc/stat: %q", line)
			}
			if i != 3 && i != 4 { // idle, iowait
				n += x
			}
		}
		return n, nil
	}
	b0, err := busy()
	if err != nil {
		return 0, err
	}
	start := time.Now()
	time.Sleep(window)
	b1, err := busy()
	if err != nil {
		return 0, err
	}
	return (b1 - b0) / (time.Since(start).Seconds() * userHZ), nil
}

// userHZ is the unit of /proc/stat (USER_HZ, 100 on Linux).
const userHZ = 100

// memAvailable reads MemAvailable from /proc/meminfo, in bytes.
func memAvailable() (int64, error) {
	info, err := meminfo.Read()
	if err == nil && info.Available == 0 {
		err = fmt.Errorf("no MemAvailable in /proc/meminfo")
	}
	return info.Available, err
}

// processMemory reads AnonPages + Shmem from /proc/meminfo, in bytes: the
// memory the host's processes hold. What a pause gives back shows there
// at once; MemAvailable would miss it for seconds on Linux 6.x, whose
// per-CPU lists keep freed pages out of MemFree (meminfo.Info).
func processMemory() (int64, error) {
	info, err := meminfo.Read()
	return info.Anon + info.Shmem, err
}

// rss is a process's resident set size in bytes (0 if unknown).
func rss(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// cgroupMemory is the memory charged to a cgroup parent and everything
// under it, on cgroup v1 (memory controller) or v2.
func cgroupMemory(parent string) int64 {
	for _, p := range []string{
		filepath.Join("/sys/fs/cgroup/memory", parent, "memory.usage_in_bytes"),
		filepath.Join("/sys/fs/cgroup", parent, "memory.current"),
	} {
		if b, err := os.ReadFile(p); err == nil {
			v, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
			return v
		}
	}
	return 0
}
