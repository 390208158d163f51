package e2e

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/test/harness"
)

// TestConcurrentCreates runs three rounds of 50 creates at once against one
// daemon: every one must succeed. Each round kills its sandboxes before the
// next, so address and name reuse under concurrency is exercised too. The
// latencies are logged for reading, not asserted (bench/ measures them).
func TestConcurrentCreates(t *testing.T) {
	d := StartDaemon(t)
	const rounds, burst = 3, 50
	for round := range rounds {
		var (
			wg   sync.WaitGroup
			mu   sync.Mutex
			ids  []string
			errs []error
		)
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
		start := time.Now()
		var lat []time.Duration
		for range burst {
			wg.Go(func() {
				t0 := time.Now()
				sb, err := d.Client.Create(ctx, client.CreateRequest{Template: "minimal", Timeout: "10m"})
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					errs = append(errs, err)
					return
				}
				ids = append(ids, sb.ID)
				lat = append(lat, time.Since(t0))
			})
		}
		wg.Wait()
		total := time.Since(start)
		for _, err := range errs {
			t.Errorf("round %d: create: %v", round+1, err)
		}
		p50, p99 := harness.Percentile(lat, 50), harness.Percentile(lat, 99)
		t.Logf("round %d: %d/%d created in %s (p50 %s, p99 %s)", round+1, len(ids), burst, total.Round(time.Millisecond), p50, p99)
		// Every sandbox works: its agent answers a command. Checked,
		// then killed, as many at once as were created.
		harness.Each(t, burst, ids, func(id string) error {
			sb, err := d.Client.Get(ctx, id)
			if err != nil {
				return err
			}
			if code, err := sb.Exec(ctx, client.ExecRequest{Cmd: "true"}); err != nil || code != 0 {
				return fmt.Errorf("true = %d, %v", code, err)
			}
			return nil
		})
		harness.Each(t, burst, ids, func(id string) error { return d.Client.Kill(ctx, id) })
		cancel()
		if t.Failed() {
			t.FailNow()
		}
	}
	AssertNoLeaks(t, d)
}
