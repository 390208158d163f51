package agent

import (
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

func TestNextPidsCheck(t *testing.T) {
	for _, c := range []struct {
		name           string
		prev           time.Duration
		n, last, limit int64
		want           time.Duration
		wantOK         bool
	}{
		{"empty: wait for a start", pidsCheckInterval, 0, 3, 100, 0, false},
		{"first read", pidsCheckInterval, 3, -1, 100, pidsCheckInterval, true},
		{"moving", pidsSteadyInterval, 4, 3, 100, pidsCheckInterval, true},
		{"still: back off", pidsCheckInterval, 3, 3, 100, 2 * pidsCheckInterval, true},
		{"still: capped", pidsSteadyInterval, 3, 3, 100, pidsSteadyInterval, true},
		{"still near the limit", pidsSteadyInterval, 50, 50, 100, pidsCheckInterval, true},
	} {
		got, ok := nextPidsCheck(c.prev, c.n, c.last, c.limit)
		if got != c.want || ok != c.wantOK {
			t.Errorf("%s: nextPidsCheck(%v, %d, %d, %d) = %v, %v; want %v, %v", c.name, c.prev, c.n, c.last, c.limit, got, ok, c.want, c.wantOK)
		}
	}
}

// TestPidsKillerPace: the killer does not wake while the workload cgroup
// is empty, wakes at once when a process starts, backs off while the
// count holds still and reads often again while it moves or stands near
// the limit. The count is a plain file standing in for pids.current.
// Every sleep below runs on the synctest bubble's virtual clock: it is
// the time the killer's timers see pass, not a wait (each is followed
// by synctest.Wait, the event that the killer is idle again).
func TestPidsKillerPace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "pids.current")
		set := func(n string) {
			if err := os.WriteFile(path, []byte(n+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		set("0")
		cur, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		defer cur.Close()
		cg := &PidsCgroup{max: 100, current: cur, started: make(chan struct{}, 1)}
		var reads atomic.Int64
		k := &pidsKiller{cg: cg, procs: &procTable{logger: slog.New(slog.DiscardHandler)}, stop: make(chan struct{})}
		k.onCount = func(int64) { reads.Add(1) }
		k.wg.Add(1)
		go k.run()
		defer k.close()
		readsOver := func(d time.Duration) int64 {
			before := reads.Load()
			time.Sleep(d)
			synctest.Wait()
			return reads.Load() - before
		}

		// Empty: one read (the first), then none.
		if n := readsOver(time.Minute); n != 1 {
			t.Errorf("empty cgroup: %d reads in a minute, want 1 (the first)", n)
		}
		// A start wakes it at once.
		set("3")
		cg.started <- struct{}{}
		synctest.Wait()
		if n := reads.Load(); n != 2 {
			t.Errorf("after a start: %d reads in all, want 2", n)
		}
		// Holding still at 3 of 100: 50, 100, 200, 400, 800 ms, then
		// every second: 5 + 8 reads in 10 s; at a fixed 50 ms it was 200.
		if n := readsOver(10 * time.Second); n < 11 || n > 16 {
			t.Errorf("count holding still: %d reads in 10 s, want about 13", n)
		}
		// Moving: read every 50 ms from the read that first sees it
		// move (within the 1 s back-off): at least 20 of 2 s's 40.
		// The reads fall on multiples of 50 ms; the changes fall between.
		time.Sleep(pidsCheckInterval / 2)
		before := reads.Load()
		for i := range 40 {
			set(strconv.Itoa(4 + i)) // up to 43: under half the limit
			time.Sleep(pidsCheckInterval)
		}
		synctest.Wait()
		if n := reads.Load() - before; n < 20 || n > 41 {
			t.Errorf("count moving: %d reads in 2 s, want 20 to 41", n)
		}
		// Near the limit (50 of 100), still: every 50 ms.
		set("50")
		time.Sleep(pidsSteadyInterval) // the change is seen within this
		synctest.Wait()
		if n := readsOver(time.Second); n < 19 || n > 21 {
			t.Errorf("count at half the limit: %d reads in 1 s, want 20", n)
		}
		// Empty again: quiet.
		set("0")
		time.Sleep(pidsCheckInterval)
		synctest.Wait()
		if n := readsOver(time.Minute); n != 0 {
			t.Errorf("emptied cgroup: %d reads in a minute, want 0", n)
		}
	})
}
