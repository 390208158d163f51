package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/test/harness"
)

// runPause measures pause and resume through the daemon (the runc
// runtime, so a filesystem pause) of a minimal sandbox whose process holds
// mib MiB, n rounds: pause time, resume time (until the agent answers
// again), and the sandbox's memory (its cgroup's) before the pause and
// host MemAvailable gained by it. The floor is a fresh create of the same
// template (create → agent answers), which a filesystem resume resembles.
func runPause(tb *runner, n, mib int) error {
	bin, cleanup, err := harness.Build()
	if err != nil {
		return err
	}
	defer cleanup()
	d := harness.StartDaemon(tb, bin)
	ctx := context.Background()
	sb, err := d.Client.Create(ctx, client.CreateRequest{Template: "minimal", Memory: strconv.Itoa(mib+256) + "M", Timeout: "2h"})
	if err != nil {
		return err
	}
	var pauses, resumes, creates []time.Duration
	var held, freed []int64
	for i := range n {
		// A process holding mib MiB, touched (awk builds the string).
		hold := fmt.Sprintf("awk 'BEGIN{s=sprintf(\"%%%ds\",\"\"); system(\"sleep 100000\")}' >/dev/null 2>&1 &", mib<<20)
		var out bytes.Buffer
		if code, err := sb.Exec(ctx, client.ExecRequest{Cmd: "/bin/sh", Args: []string{"-c", hold}, Stdout: &out, Stderr: &out}); err != nil || code != 0 {
			return fmt.Errorf("start the memory holder: %d %v %s", code, err, out.String())
		}
		mem, err := waitMemory(d, sb.ID, int64(mib)<<20*9/10)
		if err != nil {
			return err
		}
		held = append(held, mem)
		before, err := memAvailable()
		if err != nil {
			return err
		}
		t0 := time.Now()
		p, err := d.Client.Pause(ctx, sb.ID)
		if err != nil {
			return err
		}
		pauses = append(pauses, time.Since(t0))
		after, err := memAvailable()
		if err != nil {
			return err
		}
		freed = append(freed, after-before)
		t0 = time.Now()
		if _, err := d.Client.Resume(ctx, sb.ID, 0); err != nil {
			return err
		}
		resumes = append(resumes, time.Since(t0))
		t0 = time.Now()
		fresh, err := d.Client.Create(ctx, client.CreateRequest{Template: "minimal"})
		if err != nil {
			return err
		}
		creates = append(creates, time.Since(t0))
		if err := d.Client.Kill(ctx, fresh.ID); err != nil {
			return err
		}
		tb.Logf("pause round %d: pause %s (%s), resume %s, held %d MiB, MemAvailable +%d MiB", i, pauses[i], p.Pause, resumes[i], mem>>20, freed[i]>>20)
	}
	fmt.Printf("\n| pause and resume (runc: filesystem pause; process holding %d MiB) | n | p50 | p99 |\n|---|---|---|---|\n", mib)
	fmt.Printf("| pause (request → paused, CPU and memory released) | %d | %s | %s |\n", n, fmtDur(pct(pauses, 50)), fmtDur(pct(pauses, 99)))
	fmt.Printf("| resume (request → agent answers) | %d | %s | %s |\n", n, fmtDur(pct(resumes, 50)), fmtDur(pct(resumes, 99)))
	fmt.Printf("| floor: create of the same template (request → agent answers) | %d | %s | %s |\n", n, fmtDur(pct(creates, 50)), fmtDur(pct(creates, 99)))
	fmt.Printf("\n| memory | p50 |\n|---|---|\n")
	fmt.Printf("| sandbox cgroup memory before the pause | %d MiB |\n", median(held)>>20)
	fmt.Printf("| host MemAvailable gained by the pause | %d MiB |\n", median(freed)>>20)
	return d.Client.Kill(ctx, sb.ID)
}

// waitMemory waits until the sandbox's cgroup holds at least want bytes
// (the holder has built its string) and returns what it holds.
func waitMemory(d *harness.Daemon, id string, want int64) (int64, error) {
	deadline := time.Now().Add(60 * time.Second)
	for {
		var cur int64
		for _, name := range []string{"memory.current", "memory.usage_in_bytes"} {
			if p := d.CgroupFile(id, "memory", name); p != "" {
				if b, err := os.ReadFile(p); err == nil {
					cur, _ = strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
				}
				break
			}
		}
		if cur >= want {
			return cur, nil
		}
		if time.Now().After(deadline) {
			return cur, fmt.Errorf("sandbox %s holds %d bytes after 60s, want %d", id, cur, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func median(v []int64) int64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}
