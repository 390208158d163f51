package main

import (
	"context"
	"fmt"
	"time"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/test/harness"
)

// measureWarm times a create claimed from a warm pool of template minimal
// up to the first byte of `echo ok` from it, and, interleaved in the same
// loop, the floor: the same `echo ok` on a sandbox that is already running.
// Before each claim it waits (outside the timing) for the pool to refill.
func measureWarm(ctx context.Context, d *harness.Daemon, n int) (warm, plain []time.Duration, err error) {
	const tpl = "minimal"
	if _, err := d.Client.SetTemplateWarm(ctx, tpl, 1); err != nil {
		return nil, nil, err
	}
	defer func() { _, _ = d.Client.SetTemplateWarm(ctx, tpl, 0) }()
	running, err := d.Client.Create(ctx, client.CreateRequest{Template: tpl})
	if err != nil {
		return nil, nil, err
	}
	defer func() { _ = d.Client.Kill(ctx, running.ID) }()
	echo := func(sb *client.Sandbox, start time.Time) (time.Duration, error) {
		fb := newFirstByte()
		code, err := sb.Exec(ctx, client.ExecRequest{Cmd: "echo", Args: []string{"ok"}, Stdout: fb})
		if err != nil || code != 0 {
			return 0, fmt.Errorf("echo ok in %s: %d %v", sb.ID, code, err)
		}
		return fb.at.Sub(start), nil
	}
	for i := 0; i < 3; i++ { // warm the connection pool
		if _, err := echo(running, time.Now()); err != nil {
			return nil, nil, err
		}
	}
	for i := 0; i < n; i++ {
		if err := waitReady(ctx, d, tpl); err != nil {
			return nil, nil, err
		}
		p, err := echo(running, time.Now())
		if err != nil {
			return nil, nil, err
		}
		plain = append(plain, p)
		start := time.Now()
		sb, err := d.Client.Create(ctx, client.CreateRequest{Template: tpl})
		if err != nil {
			return nil, nil, fmt.Errorf("warm create: %w", err)
		}
		w, err := echo(sb, start)
		if err != nil {
			return nil, nil, err
		}
		warm = append(warm, w)
		if err := d.Client.Kill(ctx, sb.ID); err != nil {
			return nil, nil, err
		}
	}
	return warm, plain, nil
}

// waitReady waits until the template's pool holds a sandbox.
func waitReady(ctx context.Context, d *harness.Daemon, tpl string) error {
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		ts, err := d.Client.Templates(ctx)
		if err != nil {
			return err
		}
		for _, t := range ts {
			if t.Name == tpl && t.Warm != nil && t.Warm.Ready > 0 {
				return nil
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	return fmt.Errorf("warm pool of %s did not refill in 2m", tpl)
}
