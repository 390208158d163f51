package main

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/berth-sandbox/berth/client"
)

// runSnapshot measures snapshots and fork through the daemon of a
// minimal sandbox at isolation level iso that wrote mib MiB of files, n
// rounds: snapshot time and size, create-from-snapshot time (request →
// agent answers), and fork of one copy. Under gVisor the sandbox also
// holds mib MiB in memory (/dev/shm, the sentry's) and a running process,
// which a memory snapshot keeps. The floor is a fresh create of the same
// template and level in the same rounds.
func runSnapshot(tb *runner, n, mib int, iso string) error {
	d, cleanup, err := startDaemon(tb)
	if err != nil {
		return err
	}
	defer cleanup()
	ctx := context.Background()
	req := client.CreateRequest{Template: "minimal", Isolation: iso, Disk: strconv.Itoa(mib*2+256) + "M", Timeout: "2h"}
	if iso == client.IsolationGVisor {
		req.Memory = strconv.Itoa(mib*2+256) + "M"
	}
	sb, err := d.Client.Create(ctx, req)
	if err != nil {
		return err
	}
	var out bytes.Buffer
	write := fmt.Sprintf("dd if=/dev/urandom of=/home/data bs=1M count=%d 2>/dev/null && sync", mib)
	if iso == client.IsolationGVisor {
		write += fmt.Sprintf(" && dd if=/dev/urandom of=/dev/shm/data bs=1M count=%d 2>/dev/null", mib)
	}
	if code, err := sb.Exec(ctx, client.ExecRequest{Cmd: "/bin/sh", Args: []string{"-c", write}, Stdout: &out, Stderr: &out}); err != nil || code != 0 {
		return fmt.Errorf("write the data: %d %v %s", code, err, out.String())
	}
	if _, err := sb.Start(ctx, client.ExecRequest{Cmd: "/bin/sleep", Args: []string{"100000"}}); err != nil {
		return err
	}
	kind := client.SnapshotFilesystem
	var snaps, froms, forks, creates []time.Duration
	var size int64
	for i := range n {
		t0 := time.Now()
		s, err := d.Client.Snapshot(ctx, sb.ID, "bench")
		if err != nil {
			return err
		}
		snaps = append(snaps, time.Since(t0))
		size, kind = s.SizeBytes, s.Kind
		t0 = time.Now()
		cp, err := d.Client.Create(ctx, client.CreateRequest{Snapshot: s.ID})
		if err != nil {
			return err
		}
		froms = append(froms, time.Since(t0))
		t0 = time.Now()
		fk, err := d.Client.Fork(ctx, sb.ID, 1)
		if err != nil {
			return err
		}
		forks = append(forks, time.Since(t0))
		t0 = time.Now()
		fresh, err := d.Client.Create(ctx, client.CreateRequest{Template: "minimal", Isolation: iso})
		if err != nil {
			return err
		}
		creates = append(creates, time.Since(t0))
		for _, id := range []string{cp.ID, fk.Sandboxes[0].ID, fresh.ID} {
			if err := d.Client.Kill(ctx, id); err != nil {
				return err
			}
		}
		if err := d.Client.RemoveSnapshot(ctx, s.ID); err != nil {
			return err
		}
		tb.Logf("snapshot round %d: snapshot %s (%d MiB), create from it %s, fork %s, fresh create %s", i, snaps[i], size>>20, froms[i], forks[i], creates[i])
	}
	held := fmt.Sprintf("wrote %d MiB", mib)
	if iso == client.IsolationGVisor {
		held += fmt.Sprintf(", holds %d MiB in memory", mib)
	}
	fmt.Printf("\n| snapshots (%s: %s; sandbox %s) | n | p50 | p99 |\n|---|---|---|---|\n", iso, kind, held)
	fmt.Printf("| snapshot (request → recorded; the sandbox keeps running) | %d | %s | %s |\n", n, fmtDur(pct(snaps, 50)), fmtDur(pct(snaps, 99)))
	if kind == client.SnapshotMemory {
		// Its first save reads the pages the sandbox touched since it
		// started, unless the sentry took stock of them (the pause
		// table says more); the later ones find them known.
		fmt.Printf("| of it, the sandbox's first snapshot | 1 | %s | |\n", fmtDur(snaps[0]))
	}
	fmt.Printf("| create from the snapshot (request → agent answers) | %d | %s | %s |\n", n, fmtDur(pct(froms, 50)), fmtDur(pct(froms, 99)))
	fmt.Printf("| fork, one copy (request → copy's agent answers) | %d | %s | %s |\n", n, fmtDur(pct(forks, 50)), fmtDur(pct(forks, 99)))
	fmt.Printf("| floor: create of the template (request → agent answers) | %d | %s | %s |\n", n, fmtDur(pct(creates, 50)), fmtDur(pct(creates, 99)))
	fmt.Printf("| snapshot size (its own layer and memory image; the template's layers are shared) | | %d MiB | |\n", size>>20)
	return nil
}
