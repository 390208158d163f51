package main

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/internal/template"
)

// runPark measures a fleet parked and woken at once, as a host that parks
// its work sites overnight sees it: n minimal sandboxes of isolation iso,
// each running a process that holds mib MiB, paused by n concurrent
// requests, then resumed by n concurrent requests. Rows: each request's
// time (request → paused; request → agent answers), the time until the
// last of the n was done, and per sandbox the memory its cgroup held, the
// host memory the pauses gave back (the host's AnonPages + Shmem) and the
// checkpoint it left on disk. The floor is the same fleet paused and
// resumed one request at a time by the same daemon (what doing them
// together costs each one), and on gVisor raw runsc's checkpoint and
// restore of one sandbox holding the same memory.
func runPark(tb *runner, n, mib int, iso string) error {
	d, cleanup, err := startDaemon(tb)
	if err != nil {
		return err
	}
	defer cleanup()
	if err := buildMemhold(); err != nil {
		return err
	}
	ctx := context.Background()
	fleet := make([]*client.Sandbox, n)
	for i := range fleet {
		sb, err := d.Client.Create(ctx, client.CreateRequest{Template: "minimal", Memory: strconv.Itoa(mib+256) + "M", Timeout: "2h", Isolation: iso})
		if err != nil {
			return err
		}
		fleet[i] = sb
		if err := putMemhold(ctx, sb); err != nil {
			return err
		}
	}
	// hold has every sandbox of the fleet hold its memory: a memory pause
	// keeps the holder, a filesystem pause ends it.
	held := make([]bool, n)
	hold := func() error {
		var g errgroup.Group
		for i, sb := range fleet {
			if !held[i] {
				g.Go(func() error { return startMemhold(ctx, sb, mib) })
			}
		}
		return g.Wait()
	}
	// each runs op on every sandbox, all at once or one at a time, and
	// returns each one's time and the time until the last was done.
	each := func(together bool, op func(sb *client.Sandbox, i int) error) ([]time.Duration, time.Duration, error) {
		took := make([]time.Duration, n)
		start := time.Now()
		var g errgroup.Group
		if !together {
			g.SetLimit(1)
		}
		for i, sb := range fleet {
			g.Go(func() error {
				t0 := time.Now()
				err := op(sb, i)
				took[i] = time.Since(t0)
				return err
			})
		}
		err := g.Wait()
		return took, time.Since(start), err
	}
	type parked struct {
		pauses, resumes   []time.Duration
		pauseAll, wakeAll time.Duration
		charged           int64 // the sandboxes' cgroups' memory before the pause
		freed, onDisk     int64
		kinds             map[string]int
	}
	park := func(together bool) (*parked, error) {
		if err := hold(); err != nil {
			return nil, err
		}
		r := &parked{kinds: map[string]int{}}
		for _, sb := range fleet {
			r.charged += d.CgroupMemory(sb.ID)
		}
		before, err := processMemory()
		if err != nil {
			return nil, err
		}
		kinds := make([]string, n)
		r.pauses, r.pauseAll, err = each(together, func(sb *client.Sandbox, i int) error {
			p, err := d.Client.Pause(ctx, sb.ID)
			if err == nil {
				kinds[i] = p.Pause
			}
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("pause: %w", err)
		}
		after, err := processMemory()
		if err != nil {
			return nil, err
		}
		r.freed = before - after
		for i, sb := range fleet {
			if !d.CgroupGone(sb.ID) {
				return nil, fmt.Errorf("paused sandbox %s still has its cgroup", sb.ID)
			}
			r.kinds[kinds[i]]++
			held[i] = kinds[i] == client.PauseMemory
			if held[i] {
				// Parked for the night: the flush that follows a
				// memory pause is done before the morning's resume.
				d.WaitCheckpointFlushed(tb, sb.ID)
				n, err := template.DirSize(d.CheckpointDir(sb.ID))
				if err != nil {
					return nil, err
				}
				r.onDisk += n
			}
		}
		r.resumes, r.wakeAll, err = each(together, func(sb *client.Sandbox, _ int) error {
			_, err := d.Client.Resume(ctx, sb.ID, 0)
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("resume: %w", err)
		}
		tb.Logf("%s park of %d (together %v): pauses %v (%s), all paused in %s, host process memory -%d MiB; all resumed in %s", iso, n, together, r.kinds, fmtDur(pct(r.pauses, 50)), fmtDur(r.pauseAll), r.freed>>20, fmtDur(r.wakeAll))
		return r, nil
	}
	// One at a time first, so the fleet's first pauses (gVisor's first
	// save reads every page never saved) fall on the floor, not on the
	// concurrent row.
	alone, err := park(false)
	if err != nil {
		return err
	}
	together, err := park(true)
	if err != nil {
		return err
	}
	fmt.Printf("\n| a fleet parked and woken, isolation %s: %d sandboxes, each holding %d MiB (pauses made: %v) | n | p50 | p99 |\n|---|---|---|---|\n", iso, n, mib, together.kinds)
	fmt.Printf("| pause, %d requests at once (request → paused) | %d | %s | %s |\n", n, n, fmtDur(pct(together.pauses, 50)), fmtDur(pct(together.pauses, 99)))
	fmt.Printf("| resume, %d requests at once (request → agent answers) | %d | %s | %s |\n", n, n, fmtDur(pct(together.resumes, 50)), fmtDur(pct(together.resumes, 99)))
	fmt.Printf("| floor: pause, one request at a time | %d | %s | %s |\n", n, fmtDur(pct(alone.pauses, 50)), fmtDur(pct(alone.pauses, 99)))
	fmt.Printf("| floor: resume, one request at a time | %d | %s | %s |\n", n, fmtDur(pct(alone.resumes, 50)), fmtDur(pct(alone.resumes, 99)))
	if together.kinds[client.PauseMemory] > 0 {
		raw, err := measureRawPause(ctx, daemonPlatform(d.Logs()), mib, 3, daemonDirect(d.Logs()))
		if err != nil {
			return fmt.Errorf("raw runsc floor: %w", err)
		}
		saves, loads, how := raw.checkpoints, raw.restores, ""
		if len(raw.directRestores) > 0 {
			saves, loads, how = raw.directCheckpoints, raw.directRestores, " --direct"
		}
		fmt.Printf("| floor: raw `runsc checkpoint%s` of one busybox sandbox holding %d MiB | %d | %s | %s |\n", how, mib, len(saves), fmtDur(pct(saves, 50)), fmtDur(pct(saves, 99)))
		fmt.Printf("| floor: raw `runsc restore%s` of it | %d | %s | %s |\n", how, len(loads), fmtDur(pct(loads, 50)), fmtDur(pct(loads, 99)))
	}
	fmt.Printf("\n| the whole fleet of %d | at once | one at a time |\n|---|---|---|\n", n)
	fmt.Printf("| until the last was paused | %s | %s |\n", fmtDur(together.pauseAll), fmtDur(alone.pauseAll))
	fmt.Printf("| until the last answered again | %s | %s |\n", fmtDur(together.wakeAll), fmtDur(alone.wakeAll))
	fmt.Printf("| memory each sandbox's cgroup held before the pause, all given back (the cgroup is gone) | %d MiB | %d MiB |\n", together.charged/int64(n)>>20, alone.charged/int64(n)>>20)
	fmt.Printf("| host memory given back by the pauses (drop in AnonPages + Shmem), per sandbox | %d MiB | %d MiB |\n", together.freed/int64(n)>>20, alone.freed/int64(n)>>20)
	fmt.Printf("| checkpoint on disk while parked, per sandbox | %d MiB | %d MiB |\n", together.onDisk/int64(n)>>20, alone.onDisk/int64(n)>>20)
	var g errgroup.Group
	for _, sb := range fleet {
		g.Go(func() error { return d.Client.Kill(ctx, sb.ID) })
	}
	return g.Wait()
}
