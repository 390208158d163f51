package hostile

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/test/harness"
)

// TestResourceExhaustion attacks the sandbox's limits: processes, memory,
// disk, inodes, tmpfs, descriptors, output and CPU. The sandbox may hurt
// itself; the agent must keep answering, the neighbour must keep working,
// and the daemon's memory must stay bounded.
func TestResourceExhaustion(t *testing.T) {
	l := newLab(t, client.CreateRequest{Memory: "128M", Disk: "64M", CPU: 0.5})

	t.Run("fork-bomb", func(t *testing.T) {
		sb := l.d.Create(t, client.CreateRequest{})
		pid, err := sb.Start(t.Context(), client.ExecRequest{Cmd: "/bin/sh", Args: []string{"-c", "f() { f | f & }; f; sleep 1000"}})
		if err != nil {
			t.Fatal(err)
		}
		got, _ := l.d.Client.Get(t.Context(), sb.ID)
		// The bomb fills the pids cgroup; the host's process count must
		// not follow past the limit.
		harness.WaitFor(t, 30*time.Second, "the bomb to reach the pids limit", func() bool {
			return sandboxProcs(l.d, sb.ID) >= int(got.PIDsLimit)*8/10
		})
		if n := sandboxProcs(l.d, sb.ID); n > int(got.PIDsLimit) {
			t.Errorf("sandbox has %d processes, limit %d", n, got.PIDsLimit)
		}
		// The neighbour is unaffected; the bombed sandbox's agent still
		// answers (listing processes needs no fork).
		harness.MustRun(t, l.nb, "true")
		if _, err := sb.Processes(t.Context()); err != nil {
			t.Errorf("agent of the bombed sandbox: %v", err)
		}
		_ = sb.Signal(t.Context(), pid, 9)
		if err := sb.Kill(t.Context()); err != nil {
			t.Errorf("destroy bombed sandbox: %v", err)
		}
		harness.WaitFor(t, 30*time.Second, "the bomb's processes to be gone", func() bool { return sandboxProcs(l.d, sb.ID) == 0 })
		l.check(t)
	})

	t.Run("memory-balloon", func(t *testing.T) {
		// tail buffers a line that never ends until the cgroup's OOM
		// killer stops it.
		_, _, code := l.exec(t, l.sb, "/bin/sh", "-c", "tail /dev/zero")
		if code == 0 {
			t.Errorf("balloon exited 0, want an OOM kill")
		}
		o := harness.MustRun(t, l.sb, "echo alive; cat /proc/1/oom_score_adj")
		if !strings.HasPrefix(o, "alive") {
			t.Errorf("sandbox after OOM: %q", o)
		}
		harness.WaitFor(t, 10*time.Second, "the OOM kill to show in usage", func() bool {
			sb, err := l.d.Client.Get(t.Context(), l.sb.ID)
			return err == nil && sb.Usage != nil && sb.Usage.OOMKills > 0
		})
		l.check(t)
	})

	t.Run("disk-fill", func(t *testing.T) {
		o := l.shell(t, `dd if=/dev/zero of=/tmp/fill bs=1M count=1000 2>&1 | tail -1; [ $(du -m /tmp/fill | cut -f1) -le 64 ]`)
		t.Logf("%s", strings.TrimSpace(o))
		err := l.sb.WriteFile(t.Context(), "/tmp/more", strings.NewReader(strings.Repeat("x", 4<<20)))
		if err == nil {
			t.Errorf("upload to a full disk succeeded")
		}
		t.Logf("upload to full disk: %v", err)
		// The agent closes the connection after refusing an upload
		// part-way (the unread body poisons it), so the daemon's pooled
		// connections stay usable: the next request works at once.
		tries := 0
		harness.WaitFor(t, 10*time.Second, "cleanup after the disk fill", func() bool {
			tries++
			code, err := l.sb.Exec(t.Context(), client.ExecRequest{Cmd: "rm", Args: []string{"-f", "/tmp/fill", "/tmp/more"}})
			if err != nil {
				t.Logf("exec after refused upload (try %d): %v", tries, err)
			}
			return err == nil && code == 0
		})
		if tries > 1 {
			t.Errorf("sandbox needed %d tries to run a command after its disk filled", tries)
		}
		l.check(t)
	})

	t.Run("inode-exhaustion", func(t *testing.T) {
		l.attack(t, "inodes", "200000")
		harness.MustRun(t, l.sb, "rm -rf /tmp/inodes")
		l.check(t)
	})

	for _, dir := range []string{"/dev/shm", "/dev"} {
		t.Run("tmpfs-fill-"+filepath.Base(dir), func(t *testing.T) {
			// Both are tmpfs (memory) with a size cap below the 128M
			// memory limit, so filling them stops at ENOSPC, not an OOM.
			o := l.shell(t, fmt.Sprintf(`dd if=/dev/zero of=%s/fill bs=1M count=1000 2>&1 | tail -1; s=$(du -m %s/fill | cut -f1); rm -f %s/fill; echo "$s MiB"; [ $s -le 64 ]`, dir, dir, dir))
			t.Logf("%s", strings.TrimSpace(o))
			l.check(t)
		})
	}

	t.Run("open-files-100k", func(t *testing.T) {
		l.attack(t, "nofile")
		l.check(t)
	})

	t.Run("stdout-flood", func(t *testing.T) {
		pid := daemonPID(t, l.d)
		base := rssKiB(pid)
		var peak atomic.Int64
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(20 * time.Millisecond)
			defer tick.Stop()
			for {
				if r := rssKiB(pid); r > peak.Load() {
					peak.Store(r)
				}
				select {
				case <-stop:
					return
				case <-tick.C:
				}
			}
		}()
		const flood = 256 << 20
		var n countWriter
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
		defer cancel()
		code, err := l.sb.Exec(ctx, client.ExecRequest{Cmd: "/bin/sh", Args: []string{"-c", "head -c " + strconv.Itoa(flood) + " /dev/zero; head -c 1000000 /dev/zero >&2"}, Stdout: &n, Stderr: &n})
		close(stop)
		wg.Wait()
		if err != nil || code != 0 {
			t.Fatalf("flood: %d, %v", code, err)
		}
		// No truncation: backpressure slows the writer instead.
		if got := n.n.Load(); got != flood+1000000 {
			t.Errorf("client got %d bytes, want %d", got, flood+1000000)
		}
		grow := peak.Load() - base
		t.Logf("daemon RSS %d KiB before, peak %d KiB during a %d MiB flood", base, peak.Load(), flood>>20)
		if grow > 64<<10 {
			t.Errorf("daemon RSS grew by %d KiB during the flood", grow)
		}
		l.check(t)
	})

	t.Run("cpu-spin-fair-share", func(t *testing.T) {
		loop := `i=0; while [ $i -lt 600000 ]; do i=$((i+1)); done`
		timeIt := func() time.Duration {
			start := time.Now()
			harness.MustRun(t, l.nb, loop)
			return time.Since(start)
		}
		idle := timeIt()
		pid, err := l.sb.Start(t.Context(), client.ExecRequest{Cmd: "/bin/sh", Args: []string{"-c", "for i in $(seq 16); do (while :; do :; done) & done; wait"}})
		if err != nil {
			t.Fatal(err)
		}
		defer l.sb.Signal(context.WithoutCancel(t.Context()), pid, 9)
		harness.WaitFor(t, 10*time.Second, "the spinners to start", func() bool { return sandboxProcs(l.d, l.sb.ID) > 16 })
		before := cpuSeconds(t, l)
		busy := timeIt()
		spent := cpuSeconds(t, l) - before
		t.Logf("neighbour loop: %v idle, %v next to 16 spinning threads; spinner used %.2fs CPU in that time", idle, busy, spent)
		if busy > 3*idle+time.Second {
			t.Errorf("neighbour slowed from %v to %v by a spinning sandbox", idle, busy)
		}
		// 0.5 CPU allowed; generous for accounting granularity.
		if limit := 0.5*busy.Seconds()*1.5 + 0.3; spent > limit {
			t.Errorf("spinner used %.2fs CPU in %v, above its 0.5 CPU share", spent, busy)
		}
		_ = l.sb.Signal(t.Context(), pid, 9)
		l.check(t)
	})
}

type countWriter struct{ n atomic.Int64 }

func (c *countWriter) Write(p []byte) (int, error) {
	c.n.Add(int64(len(p)))
	return len(p), nil
}

func cpuSeconds(t *testing.T, l *lab) float64 {
	t.Helper()
	sb, err := l.d.Client.Get(t.Context(), l.sb.ID)
	if err != nil || sb.Usage == nil {
		t.Fatalf("usage: %v", err)
	}
	return sb.Usage.CPUSeconds
}

// sandboxProcs counts live host processes in the sandbox's cgroup.
func sandboxProcs(d *harness.Daemon, id string) int {
	n := 0
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		cg, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cgroup"))
		if err != nil || !strings.Contains(string(cg), "/berth-"+d.Instance+"/") || !strings.Contains(string(cg), id) {
			continue
		}
		// A zombie is dead; it waits only for the host's init to reap it
		// once runc has gone.
		if st, err := os.ReadFile(filepath.Join("/proc", e.Name(), "status")); err == nil && strings.Contains(string(st), "State:\tZ") {
			continue
		}
		n++
	}
	return n
}

// daemonPID finds the daemon's process by its data dir.
func daemonPID(t *testing.T, d *harness.Daemon) int {
	t.Helper()
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmd, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		args := strings.Split(string(cmd), "\x00")
		if len(args) > 2 && args[1] == "serve" && strings.Contains(string(cmd), "\x00"+d.DataDir+"\x00") {
			return pid
		}
	}
	t.Fatalf("daemon process for %s not found", d.DataDir)
	return 0
}

// rssKiB is a process's resident set from /proc/PID/status.
func rssKiB(pid int) int64 {
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(st), "\n") {
		if f := strings.Fields(line); len(f) > 1 && f[0] == "VmRSS:" {
			n, _ := strconv.ParseInt(f[1], 10, 64)
			return n
		}
	}
	return 0
}
