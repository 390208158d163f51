package main

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/berth-sandbox/berth/client"
)

// runSnapshot measures snapshots and fork through the daemon (runc level,
// filesystem snapshots) of a minimal sandbox that wrote mib MiB of files,
// n rounds: snapshot time and size, create-from-snapshot time (request →
// agent answers), and fork of one copy. The floor is a fresh create of the
// same template in the same rounds.
func runSnapshot(tb *runner, n, mib int) error {
	d, cleanup, err := startDaemon(tb)
	if err != nil {
		return err
	}
	defer cleanup()
	ctx := context.Background()
	sb, err := d.Client.Create(ctx, client.CreateRequest{Template: "minimal", Disk: strconv.Itoa(mib*2+256) + "M", Timeout: "2h"})
	if err != nil {
		return err
	}
	var out bytes.Buffer
	write := fmt.Sprintf("dd if=/dev/urandom of=/home/data bs=1M count=%d 2>/dev/null && sync", mib)
	if code, err := sb.Exec(ctx, client.ExecRequest{Cmd: "/bin/sh", Args: []string{"-c", write}, Stdout: &out, Stderr: &out}); err != nil || code != 0 {
		return fmt.Errorf("write the data: %d %v %s", code, err, out.String())
	}
	var snaps, froms, forks, creates []time.Duration
	var size int64
	for i := range n {
		t0 := time.Now()
		s, err := d.Client.Snapshot(ctx, sb.ID, "bench")
		if err != nil {
			return err
		}
		snaps = append(snaps, time.Since(t0))
		size = s.SizeBytes
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
		fresh, err := d.Client.Create(ctx, client.CreateRequest{Template: "minimal"})
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
	fmt.Printf("\n| snapshots (runc: filesystem; sandbox wrote %d MiB) | n | p50 | p99 |\n|---|---|---|---|\n", mib)
	fmt.Printf("| snapshot (request → recorded; the sandbox keeps running) | %d | %s | %s |\n", n, fmtDur(pct(snaps, 50)), fmtDur(pct(snaps, 99)))
	fmt.Printf("| create from the snapshot (request → agent answers) | %d | %s | %s |\n", n, fmtDur(pct(froms, 50)), fmtDur(pct(froms, 99)))
	fmt.Printf("| fork, one copy (request → copy's agent answers) | %d | %s | %s |\n", n, fmtDur(pct(forks, 50)), fmtDur(pct(forks, 99)))
	fmt.Printf("| floor: create of the template (request → agent answers) | %d | %s | %s |\n", n, fmtDur(pct(creates, 50)), fmtDur(pct(creates, 99)))
	fmt.Printf("| snapshot size (its own layer; the template's are shared) | | %d MiB | |\n", size>>20)
	return nil
}
