package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/test/harness"
)

// runPause measures pause and resume through the daemon of a minimal
// sandbox whose process holds mib MiB, n rounds per isolation level in
// isos, one table each in the same run: pause time, resume time (until
// the agent answers again), the kind of pause the daemon made (runc: a
// filesystem pause; gVisor: memory where runsc can checkpoint the
// sandbox), and the sandbox's memory (its cgroup's) before the pause and
// the host memory given back by it (the drop in the host's AnonPages +
// Shmem). The floor is a fresh create of the same template and level
// (create → agent answers), which a filesystem resume resembles.
func runPause(tb *runner, n, mib int, isos []string) error {
	// Debug logging: the runtime's phase timings say how much of a
	// gVisor pause and resume runsc itself took (runscPhase).
	d, cleanup, err := startDaemon(tb, "--debug")
	if err != nil {
		return err
	}
	defer cleanup()
	if err := buildMemhold(); err != nil {
		return err
	}
	for _, iso := range isos {
		if err := pauseRows(tb, d, n, mib, iso); err != nil {
			return fmt.Errorf("isolation %s: %w", iso, err)
		}
	}
	return nil
}

// memholdBin is the static memory holder (test/harness/memhold) runPause
// puts into its sandboxes.
var memholdBin string

// pauseRows prints runPause's table for one isolation level.
func pauseRows(tb *runner, d *harness.Daemon, n, mib int, iso string) error {
	ctx := context.Background()
	sb, err := holderSandbox(ctx, d, mib, iso)
	if err != nil {
		return err
	}
	var pauses, resumes, creates, saves, loads, flushes []time.Duration
	var held, freed []int64
	firstSaved := false // round 0's pause kept the memory (saves[0] is its save)
	kinds := map[string]int{}
	// A memory pause keeps the holder running; a filesystem pause ends
	// it, and the next round starts another.
	needHolder := true
	for i := range n {
		if needHolder {
			if err := startMemhold(ctx, sb, mib); err != nil {
				return err
			}
		}
		// A holder restored from a checkpoint is charged to the new
		// cgroup as the sentry touches its pages again, not at once.
		mem := d.CgroupMemory(sb.ID)
		held = append(held, mem)
		before, err := processMemory()
		if err != nil {
			return err
		}
		t0 := time.Now()
		p, err := d.Client.Pause(ctx, sb.ID)
		if err != nil {
			return err
		}
		pauses = append(pauses, time.Since(t0))
		kinds[p.Pause]++
		if p.Pause == client.PauseMemory {
			saves = append(saves, runscPhase(d.Logs(), sb.ID, "sandbox checkpointed", "runsc_checkpoint", len(saves)))
			firstSaved = firstSaved || i == 0
		}
		needHolder = p.Pause != client.PauseMemory
		after, err := processMemory()
		if err != nil {
			return err
		}
		freed = append(freed, before-after)
		if p.Pause == client.PauseMemory {
			// The flush that lets the checkpoint outlive a host
			// restart follows the pause a moment later; a sandbox
			// parked for longer than that resumes after it, as here.
			d.WaitCheckpointFlushed(tb, sb.ID)
			flushes = append(flushes, runscPhase(d.Logs(), sb.ID, "checkpoint_synced", "elapsed", len(flushes)))
		}
		t0 = time.Now()
		if _, err := d.Client.Resume(ctx, sb.ID, 0); err != nil {
			return err
		}
		resumes = append(resumes, time.Since(t0))
		if p.Pause == client.PauseMemory {
			loads = append(loads, runscPhase(d.Logs(), sb.ID, "sandbox restored", "runsc_restore", len(loads)))
		}
		t0 = time.Now()
		fresh, err := d.Client.Create(ctx, client.CreateRequest{Template: "minimal", Isolation: iso})
		if err != nil {
			return err
		}
		creates = append(creates, time.Since(t0))
		if err := d.Client.Kill(ctx, fresh.ID); err != nil {
			return err
		}
		inside := ""
		if p.Pause == client.PauseMemory {
			inside = fmt.Sprintf(" (runsc checkpoint %s, restore %s)", saves[len(saves)-1], loads[len(loads)-1])
		}
		tb.Logf("%s pause round %d: pause %s (%s), resume %s%s, held %d MiB, host process memory -%d MiB", iso, i, pauses[i], p.Pause, resumes[i], inside, mem>>20, freed[i]>>20)
	}
	fmt.Printf("\n| pause and resume, isolation %s (pauses made: %v; process holding %d MiB) | n | p50 | p99 |\n|---|---|---|---|\n", iso, kinds, mib)
	fmt.Printf("| pause (request → paused, CPU and memory released) | %d | %s | %s |\n", n, fmtDur(pct(pauses, 50)), fmtDur(pct(pauses, 99)))
	if firstSaved {
		// The first pause of a sandbox is the one most users make (a
		// work site parked overnight), and gVisor's slowest: its first
		// save reads every page the sandbox touched since its start.
		fmt.Printf("| of it, the sandbox's first pause (and its `runsc checkpoint`: %s) | 1 | %s | |\n", fmtDur(saves[0]), fmtDur(pauses[0]))
	}
	fmt.Printf("| resume (request → agent answers) | %d | %s | %s |\n", n, fmtDur(pct(resumes, 50)), fmtDur(pct(resumes, 99)))
	if len(saves) > 0 {
		fmt.Printf("| of the pause: `runsc checkpoint` itself (the sentry saves its memory) | %d | %s | %s |\n", len(saves), fmtDur(pct(saves, 50)), fmtDur(pct(saves, 99)))
		fmt.Printf("| after the pause, in the background: the checkpoint and writable layer flushed to the disk | %d | %s | %s |\n", len(flushes), fmtDur(pct(flushes, 50)), fmtDur(pct(flushes, 99)))
		fmt.Printf("| of the resume: `runsc restore` itself (the sentry loads its memory) | %d | %s | %s |\n", len(loads), fmtDur(pct(loads, 50)), fmtDur(pct(loads, 99)))
	}
	var ready *readyResumes
	if len(saves) > 0 {
		if ready, err = measureReadyResumes(tb, n, mib, iso); err != nil {
			return fmt.Errorf("ready resumes: %w", err)
		}
		fmt.Printf("| resume of a ready sandbox (a second daemon, `--resume-ready 1`: the runtime sandbox made after the pause) | %d | %s | %s |\n", n, fmtDur(pct(ready.resumes, 50)), fmtDur(pct(ready.resumes, 99)))
		fmt.Printf("| of it: `runsc restore` into the ready sandbox | %d | %s | %s |\n", n, fmtDur(pct(ready.loads, 50)), fmtDur(pct(ready.loads, 99)))
	}
	fmt.Printf("| floor: create of the same template (request → agent answers) | %d | %s | %s |\n", n, fmtDur(pct(creates, 50)), fmtDur(pct(creates, 99)))
	if len(saves) > 0 {
		// runsc's own floor, by hand on the daemon's platform.
		platform := daemonPlatform(d.Logs())
		raw, err := measureRawPause(ctx, platform, mib, n, daemonDirect(d.Logs()))
		if err != nil {
			return fmt.Errorf("raw runsc floor: %w", err)
		}
		fmt.Printf("| floor: raw `runsc checkpoint` of a busybox sandbox holding %d MiB (%s, no daemon, network or limits) | %d | %s | %s |\n", mib, platform, n, fmtDur(pct(raw.checkpoints, 50)), fmtDur(pct(raw.checkpoints, 99)))
		fmt.Printf("| floor: raw `runsc restore` of it | %d | %s | %s |\n", n, fmtDur(pct(raw.restores, 50)), fmtDur(pct(raw.restores, 99)))
		if len(raw.directRestores) > 0 {
			fmt.Printf("| floor: raw `runsc checkpoint --direct` (pages written with O_DIRECT, as the daemon does) | %d | %s | %s |\n", n, fmtDur(pct(raw.directCheckpoints, 50)), fmtDur(pct(raw.directCheckpoints, 99)))
			fmt.Printf("| floor: of it, the sandbox's first (gVisor reads every page never saved nor loaded before, to skip the zero ones) | 1 | %s | |\n", fmtDur(raw.directCheckpoints[0]))
			fmt.Printf("| floor: raw `runsc restore --direct` of it | %d | %s | %s |\n", n, fmtDur(pct(raw.directRestores, 50)), fmtDur(pct(raw.directRestores, 99)))
		}
	}
	// The phases behind the rows, for a look at where the time went.
	for line := range strings.SplitSeq(d.Logs(), "\n") {
		if strings.Contains(line, "sandbox_id="+sb.ID) && slices.ContainsFunc(pauseLogMsgs, func(m string) bool { return strings.Contains(line, m) }) {
			tb.Logf("%s", line)
		}
	}
	fmt.Printf("\n| memory | p50 |\n|---|---|\n")
	fmt.Printf("| sandbox cgroup memory before the pause | %d MiB |\n", median(held)>>20)
	fmt.Printf("| host memory given back by the pause (drop in AnonPages + Shmem) | %d MiB |\n", median(freed)>>20)
	if ready != nil {
		fmt.Printf("| a ready paused sandbox's cgroup (its waiting sentry) | %d MiB |\n", median(ready.held)>>20)
	}
	return d.Client.Kill(ctx, sb.ID)
}

// readyResumes are the rows of resumes into a ready sandbox
// (--resume-ready): request → agent answers, runsc's restore in it, and
// what the paused sandbox's cgroup held while it waited.
type readyResumes struct {
	resumes, loads []time.Duration
	held           []int64
}

// measureReadyResumes pauses and resumes, n rounds, a sandbox like
// pauseRows's on a second daemon with --resume-ready 1, each resume once
// the daemon reports the sandbox ready to resume and its checkpoint
// flushed.
func measureReadyResumes(tb *runner, n, mib int, iso string) (*readyResumes, error) {
	ctx := context.Background()
	d := harness.StartDaemon(tb, built, "--debug", "--resume-ready", "1")
	defer d.Stop()
	sb, err := holderSandbox(ctx, d, mib, iso)
	if err != nil {
		return nil, err
	}
	defer func() { _ = d.Client.Kill(ctx, sb.ID) }()
	if err := startMemhold(ctx, sb, mib); err != nil {
		return nil, err
	}
	out := &readyResumes{}
	for i := range n {
		if _, err := d.Client.Pause(ctx, sb.ID); err != nil {
			return nil, err
		}
		if err := waitEvents(ctx, d, sb.ID, client.EventResumeReady, i+1); err != nil {
			return nil, err
		}
		d.WaitCheckpointFlushed(tb, sb.ID)
		out.held = append(out.held, d.CgroupMemory(sb.ID))
		t0 := time.Now()
		if _, err := d.Client.Resume(ctx, sb.ID, 0); err != nil {
			return nil, err
		}
		out.resumes = append(out.resumes, time.Since(t0))
		out.loads = append(out.loads, runscPhase(d.Logs(), sb.ID, "sandbox restored", "runsc_restore_prepared", i))
		tb.Logf("%s ready resume round %d: resume %s (runsc restore %s), paused cgroup %d MiB", iso, i, out.resumes[i], out.loads[i], out.held[i]>>20)
	}
	return out, nil
}

// waitEvents waits, up to 2 minutes, until sandbox id has recorded its
// nth event of type typ.
func waitEvents(ctx context.Context, d *harness.Daemon, id, typ string, nth int) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	seen := 0
	errSeen := errors.New("seen")
	err := d.Client.FollowEvents(ctx, id, func(e client.Event) error {
		if e.Type == typ {
			if seen++; seen >= nth {
				return errSeen
			}
		}
		return nil
	})
	if errors.Is(err, errSeen) {
		return nil
	}
	return fmt.Errorf("sandbox %s: %d of %d %s events: %w", id, seen, nth, typ, err)
}

// pauseLogMsgs are the daemon's debug lines with the phases of a pause and a
// resume (the runtime's and the Manager's), printed after each table.
var pauseLogMsgs = []string{`msg="sandbox checkpointed"`, `msg="sandbox restored"`, "msg=checkpoint_phases", "msg=pause_phases", "msg=checkpoint_synced", "msg=resume_phases"}

// holderSandbox creates the sandbox the pause rows measure (template
// minimal at level iso, memory limit mib + 256 MiB) with memholdBin in
// it, not yet started.
func holderSandbox(ctx context.Context, d *harness.Daemon, mib int, iso string) (*client.Sandbox, error) {
	sb, err := d.Client.Create(ctx, client.CreateRequest{Template: "minimal", Memory: strconv.Itoa(mib+256) + "M", Timeout: "2h", Isolation: iso})
	if err != nil {
		return nil, err
	}
	if err := putMemhold(ctx, sb); err != nil {
		_ = d.Client.Kill(ctx, sb.ID)
		return nil, err
	}
	return sb, nil
}

// putMemhold copies memholdBin into sb as /tmp/memhold.
func putMemhold(ctx context.Context, sb *client.Sandbox) error {
	holder, err := os.Open(memholdBin)
	if err != nil {
		return err
	}
	defer holder.Close()
	if err := sb.WriteFile(ctx, "/tmp/memhold", holder); err != nil {
		return fmt.Errorf("put memhold into %s: %w", sb.ID, err)
	}
	if code, err := sb.Exec(ctx, client.ExecRequest{Cmd: "chmod", Args: []string{"755", "/tmp/memhold"}}); err != nil || code != 0 {
		return fmt.Errorf("chmod memhold in %s: %d %v", sb.ID, code, err)
	}
	return nil
}

// startMemhold starts, in sb, a process holding mib MiB of pseudo-random
// bytes, every page touched and none compressible or zero, and waits
// until it says it holds them: its build passes through the memory, so
// the cgroup's count alone could be read mid-way (and a pause would then
// seem to free less).
func startMemhold(ctx context.Context, sb *client.Sandbox, mib int) error {
	hold := fmt.Sprintf("rm -f /tmp/.held; (/tmp/memhold -mib %d -ready /tmp/.held </dev/null >/tmp/memhold.log 2>&1 &)", mib)
	var out bytes.Buffer
	if code, err := sb.Exec(ctx, client.ExecRequest{Cmd: "/bin/sh", Args: []string{"-c", hold}, Stdout: &out, Stderr: &out}); err != nil || code != 0 {
		return fmt.Errorf("start the memory holder in %s: %d %v %s", sb.ID, code, err, out.String())
	}
	return waitHeld(ctx, sb)
}

// buildMemhold builds test/harness/memhold into memholdBin.
func buildMemhold() error {
	memholdBin = filepath.Join(built.Dir, "memhold")
	return harness.GoBuild(memholdBin, "./test/harness/memhold", true)
}

// waitHeld waits until the memory holder in sb says it holds its memory
// (a bench, not a test: it asks every 50 ms, for up to a minute).
func waitHeld(ctx context.Context, sb *client.Sandbox) error {
	deadline := time.Now().Add(60 * time.Second)
	for {
		code, err := sb.Exec(ctx, client.ExecRequest{Cmd: "test", Args: []string{"-e", "/tmp/.held"}})
		if err != nil {
			return err
		}
		if code == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("sandbox %s: the memory holder has not built its string after 60s", sb.ID)
		}
		time.Sleep(50 * time.Millisecond)
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

// runscPhase reads a phase's duration from the daemon's debug log: key's
// value on the nth line with msg for sandbox id (0 when there is none).
func runscPhase(logs, id, msg, key string, nth int) time.Duration {
	seen := 0
	for line := range strings.SplitSeq(logs, "\n") {
		// slog quotes a message with spaces only.
		if !strings.Contains(line, "msg="+strconv.Quote(msg)+" ") && !strings.Contains(line, "msg="+msg+" ") || !strings.Contains(line, "sandbox_id="+id) {
			continue
		}
		if seen++; seen <= nth {
			continue
		}
		for f := range strings.FieldsSeq(line) {
			if v, ok := strings.CutPrefix(f, key+"="); ok {
				d, _ := time.ParseDuration(v)
				return d
			}
		}
	}
	return 0
}
