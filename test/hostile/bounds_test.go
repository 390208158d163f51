package hostile

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/test/harness"
)

// TestDaemonBounds attacks the daemon itself from one sandbox: what it
// buffers of the sandbox's output, the descriptors and goroutines its
// egress proxy spends on the sandbox's connections, the CPU its resolver
// spends on queries, the audit log the sandbox's traffic fills, and the
// file API's handling of files that are not files. Each attack must stay
// within a bound the host can see (daemon RSS, descriptors, the usage the
// daemon reports), and the daemon must keep answering its API and the
// neighbours' traffic meanwhile.
func TestDaemonBounds(t *testing.T) {
	tn := harness.StartTestNet(t)
	// Random names under flood.test are allowed (so a flood of them fills
	// the audit log with allowed lookups); the audit log's files rotate
	// at 64 KiB, so the flood rotates them many times over.
	pol := &client.NetworkPolicy{Mode: client.NetAllow, Allow: []string{"allowed.test", "*.flood.test"}}
	cfgArgs := tn.ConfigFile(t)
	f, err := os.OpenFile(cfgArgs[1], os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintln(f, "audit_max_bytes: 65536")
	f.Close()
	l := newLab(t, client.CreateRequest{Memory: "128M", Disk: "64M", CPU: 0.5, Network: pol}, cfgArgs...)
	pid := l.d.PID()
	// A neighbour with egress: the proxy and resolver must keep serving it.
	nbe := l.d.Create(t, client.CreateRequest{Network: pol})
	l.copyAttacker(t, nbe)
	neighbourFetch := func(t *testing.T) {
		t.Helper()
		o, e, code := l.exec(t, nbe, "/tmp/attacker", "fetch", tn.IP.String()+":80", "allowed.test")
		if code != 0 || !strings.Contains(o, " 200 ") {
			t.Errorf("neighbour's HTTP through the proxy: exit %d, %q %q", code, o, e)
		}
		o, _, _ = l.exec(t, nbe, "/tmp/attacker", "lookup", "allowed.test")
		if !strings.Contains(o, "NOERROR") {
			t.Errorf("neighbour's DNS: %q", o)
		}
	}
	neighbourFetch(t)

	t.Run("review-output-flood", func(t *testing.T) {
		// The sandbox's git is its own: this one answers the commit's
		// "rev-parse HEAD" with 128 MiB, and leaves 128 MiB (sparse) as
		// the diff and the patch series.
		fake := `#!/bin/sh
while [ "$1" = -c ]; do shift 2; done
case "$*" in
"rev-parse HEAD") head -c 134217728 /dev/zero | tr '\0' a ;;
"diff --cached --quiet") exit 1 ;;
diff*|format-patch*) truncate -s 134217728 /proc/self/fd/1 ;;
write-tree|"rev-parse HEAD^{tree}") echo 0000 ;;
esac
exit 0
`
		if err := l.sb.WriteFile(t.Context(), "/usr/local/bin/git", strings.NewReader(fake)); err != nil {
			t.Fatal(err)
		}
		harness.MustRun(t, l.sb, "chmod 755 /usr/local/bin/git && mkdir -p /workspace")
		const flood = 128 << 20
		rss := watchRSS(pid)
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
		defer cancel()
		_, err := l.d.Client.Commit(ctx, l.sb.ID, client.CommitRequest{Message: "x"})
		if !errors.Is(err, errdefs.ErrFailedPrecondition) {
			t.Errorf("commit answering 128 MiB: %v, want a failed precondition", err)
		}
		t.Logf("commit: %v", err)
		var n countWriter
		if err := l.d.Client.Diff(ctx, l.sb.ID, "", &n); err != nil || n.n.Load() != flood {
			t.Errorf("diff: %d bytes, %v; want %d", n.n.Load(), err, flood)
		}
		n.n.Store(0)
		if err := l.d.Client.Export(ctx, l.sb.ID, "", "patch", &n); err != nil || n.n.Load() != flood {
			t.Errorf("export: %d bytes, %v; want %d", n.n.Load(), err, flood)
		}
		base, peak := rss()
		t.Logf("daemon RSS %d KiB before, peak %d KiB while the sandbox produced 3 x %d MiB through commit, diff and export", base, peak, flood>>20)
		if peak-base > 64<<10 {
			t.Errorf("daemon RSS grew by %d KiB", peak-base)
		}
		harness.MustRun(t, l.sb, "rm -f /usr/local/bin/git")
		l.check(t)
	})

	t.Run("proxy-connection-flood", func(t *testing.T) {
		fds0 := fdCount(pid)
		// 5000 to the proxy, 2000 to the resolver's TCP port.
		var fpids []uint32
		for _, f := range []struct{ n, addr, ready string }{
			{"5000", tn.IP.String() + ":443", "/tmp/connflood.ready"},
			{"2000", "dns", "/tmp/dnsflood.ready"},
		} {
			fpid, err := l.sb.Start(t.Context(), client.ExecRequest{Cmd: "/tmp/attacker", Args: []string{"connflood", f.n, f.addr, f.ready}})
			if err != nil {
				t.Fatal(err)
			}
			fpids = append(fpids, fpid)
			defer l.sb.Signal(context.WithoutCancel(t.Context()), fpid, 9)
		}
		var msg strings.Builder
		for _, ready := range []string{"/tmp/connflood.ready", "/tmp/dnsflood.ready"} {
			var m strings.Builder
			harness.WaitFor(t, 3*time.Minute, "the sandbox to open its connections ("+ready+")", func() bool {
				m.Reset()
				return l.sb.ReadFile(t.Context(), ready, &m) == nil
			})
			msg.WriteString(strings.TrimSpace(m.String()) + "; ")
		}
		fds := fdCount(pid)
		u := usage(t, l)
		t.Logf("%sdaemon fds %d before, %d while they are held; usage: %d accepted, %d refused, %d open", msg.String(), fds0, fds, u.ProxyConnections, u.ProxyRefused, u.ProxyOpen)
		// The daemon holds at most the sandbox's 256 proxied connections
		// (two descriptors each once dialed) and 8 DNS ones, not 7000.
		if fds-fds0 > 600 {
			t.Errorf("daemon descriptors grew by %d for one sandbox's idle connections", fds-fds0)
		}
		if u.ProxyRefused == 0 || u.ProxyOpen > 256 {
			t.Errorf("usage = %d refused, %d open; want refusals and at most 256 open", u.ProxyRefused, u.ProxyOpen)
		}
		healthUnderAttack(t, l)
		neighbourFetch(t)
		for _, fpid := range fpids {
			_ = l.sb.Signal(t.Context(), fpid, 9)
		}
		harness.WaitFor(t, 60*time.Second, "the proxy to let go of the connections", func() bool { return usage(t, l).ProxyOpen == 0 })
		l.check(t)
	})

	t.Run("dns-flood-and-audit-evidence", func(t *testing.T) {
		o, _, _ := l.exec(t, l.sb, "/tmp/attacker", "lookup", "evidence.denied.test")
		if !strings.Contains(o, "REFUSED") {
			t.Fatalf("denied lookup: %q", o)
		}
		u0 := usage(t, l)
		cpu0 := procCPU(pid)
		const queries = 300000
		done := make(chan string, 1)
		go func() {
			o, e, _ := l.exec(t, l.sb, "/tmp/attacker", "dnsflood", strconv.Itoa(queries))
			done <- strings.TrimSpace(o + e)
		}()
		harness.WaitFor(t, 60*time.Second, "the resolver to start dropping the flood", func() bool { return usage(t, l).DNSDropped > u0.DNSDropped })
		healthUnderAttack(t, l)
		neighbourFetch(t)
		out := <-done
		cpu := procCPU(pid) - cpu0
		u := usage(t, l)
		q, dropped := u.DNSQueries-u0.DNSQueries, u.DNSDropped-u0.DNSDropped
		t.Logf("%s; resolver saw %d queries, dropped %d; daemon CPU %.2fs, sandbox CPU %.2fs", out, q, dropped, cpu, u.CPUSeconds-u0.CPUSeconds)
		// The kernel drops most of the flood in the sandbox's chain, before
		// the daemon sees it; the resolver drops part of the rest. Both
		// are counted against the sandbox.
		kernel := kernelDNSDrops(t, l)
		t.Logf("kernel dropped %d DNS packets in the sandbox's chain", kernel)
		if kernel == 0 {
			t.Errorf("the kernel dropped none of a %d-query flood", queries)
		}
		if q == 0 || dropped == 0 {
			t.Errorf("usage attributes %d queries (%d dropped) of a %d-query flood", q, dropped, queries)
		}
		recs, err := l.d.Client.NetworkLog(t.Context(), l.sb.ID, true)
		if err != nil {
			t.Fatal(err)
		}
		found, stood := false, int64(0)
		for _, r := range recs {
			if r.Name == "evidence.denied.test" {
				found = true
			}
			stood += max(r.Count, 1)
		}
		t.Logf("denials in the audit log: %d records standing for %d decisions", len(recs), stood)
		if !found {
			t.Errorf("the denied lookup of evidence.denied.test is gone from the audit log after the flood")
		}
		// Whether the flood rotated files away depends on how much of it
		// aggregation and the rate limit folded into summaries; either way
		// the denial above had to survive. Retention across rotation
		// itself is pinned by internal/audit's unit tests.
		if kept, err := os.Stat(filepath.Join(l.d.DataDir, "audit", l.sb.ID+".jsonl.kept")); err == nil {
			t.Logf("audit log rotated; %d bytes of earliest records and denials kept", kept.Size())
		} else {
			t.Logf("the flood's records fit without rotating the oldest file away (%v)", err)
		}
		if stood < dropped {
			t.Errorf("audit log accounts for %d denials, the resolver dropped %d", stood, dropped)
		}
		l.check(t)
	})

	t.Run("cp-fifo", func(t *testing.T) {
		harness.MustRun(t, l.sb, "rm -rf /tmp/d && mkdir -p /tmp/d/sub && echo hi > /tmp/d/a && echo there > /tmp/d/sub/b && mkfifo /tmp/d/pipe /tmp/d/sub/pipe2")
		dst := t.TempDir()
		o, e, code := cliTimeout(t, l.d, "cp", l.sb.ID+":/tmp/d", dst+"/")
		t.Logf("cp of a directory with FIFOs: exit %d, %q %q", code, o, e)
		if code != 0 || !strings.Contains(e, "pipe") || !strings.Contains(e, "FIFO") {
			t.Errorf("cp of a directory with FIFOs: exit %d, stderr %q; want success with a note naming the FIFOs", code, e)
		}
		if b, err := os.ReadFile(filepath.Join(dst, "d/sub/b")); err != nil || string(b) != "there\n" {
			t.Errorf("copied d/sub/b = %q, %v", b, err)
		}
		if _, err := os.Lstat(filepath.Join(dst, "d/pipe")); err == nil {
			t.Errorf("the FIFO was copied to the host")
		}
		_, e, code = cliTimeout(t, l.d, "cp", l.sb.ID+":/tmp/d/pipe", filepath.Join(dst, "p"))
		if code == 0 || !strings.Contains(e, "FIFO") {
			t.Errorf("cp of a FIFO: exit %d, stderr %q; want an error naming the FIFO", code, e)
		}
		var sink countWriter
		if err := l.sb.ReadFile(t.Context(), "/tmp/d/pipe", &sink); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("download of a FIFO: %v, want invalid argument", err)
		}
		l.check(t)
	})

	t.Run("cp-sparse", func(t *testing.T) {
		// 1 GiB apparent in a 64 MiB sandbox.
		harness.MustRun(t, l.sb, "rm -rf /tmp/d; truncate -s 1G /tmp/sparse && echo end >> /tmp/sparse")
		dst := filepath.Join(t.TempDir(), "sparse")
		o, e, code := cliTimeout(t, l.d, "cp", l.sb.ID+":/tmp/sparse", dst)
		if code != 0 {
			t.Fatalf("cp of a sparse file: exit %d, %q %q", code, o, e)
		}
		var st syscall.Stat_t
		if err := syscall.Stat(dst, &st); err != nil {
			t.Fatal(err)
		}
		t.Logf("sparse copy: %d bytes, %d bytes on disk", st.Size, st.Blocks*512)
		if st.Size != 1<<30+4 || st.Blocks*512 > 64<<20 {
			t.Errorf("host copy: size %d, %d bytes on disk; want %d bytes taking at most the sandbox's 64 MiB", st.Size, st.Blocks*512, 1<<30+4)
		}
		harness.MustRun(t, l.sb, "rm -f /tmp/sparse")
		l.check(t)
	})
}

// watchRSS samples pid's resident set until the returned function is
// called, which gives the first sample and the peak.
func watchRSS(pid int) func() (base, peak int64) {
	base := rssKiB(pid)
	var max atomic.Int64
	max.Store(base)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			if r := rssKiB(pid); r > max.Load() {
				max.Store(r)
			}
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()
	return func() (int64, int64) {
		close(stop)
		wg.Wait()
		return base, max.Load()
	}
}

// kernelDNSDrops reads the packet counter of the DNS rate limit in the
// sandbox's firewall chain.
func kernelDNSDrops(t *testing.T, l *lab) int64 {
	t.Helper()
	out, err := exec.Command("nft", "list", "chain", "inet", "berth_"+l.d.Instance, "sbx-"+l.sb.ID).CombinedOutput()
	if err != nil {
		t.Fatalf("nft: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`udp dport 53 limit rate over \S+ burst \d+ packets counter packets (\d+)`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("no DNS rate limit in the sandbox's chain:\n%s", out)
	}
	n, _ := strconv.ParseInt(string(m[1]), 10, 64)
	return n
}

func fdCount(pid int) int {
	ents, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	return len(ents)
}

// procCPU is a process's user+system CPU time in seconds.
func procCPU(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// Fields after the command name (which may hold spaces) start at ")".
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (ut + st) / 100 // USER_HZ
}

func usage(t *testing.T, l *lab) client.Usage {
	t.Helper()
	sb, err := l.d.Client.Get(t.Context(), l.sb.ID)
	if err != nil || sb.Usage == nil {
		t.Fatalf("usage: %v", err)
	}
	return *sb.Usage
}

// healthUnderAttack asserts that the daemon's API answers while an attack
// runs, within a generous bound, and logs how long it took.
func healthUnderAttack(t *testing.T, l *lab) {
	t.Helper()
	var worst time.Duration
	for range 5 {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		start := time.Now()
		_, err := l.d.Client.Health(ctx)
		d := time.Since(start)
		cancel()
		if err != nil {
			t.Errorf("daemon health under attack: %v (after %v)", err, d)
			return
		}
		worst = max(worst, d)
	}
	t.Logf("daemon health under attack: slowest of 5 answers %v", worst)
}

// cliTimeout runs the CLI against the daemon, bounded so a hang fails the
// test instead of stalling it.
func cliTimeout(t *testing.T, d *harness.Daemon, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin.Berth, args...)
	cmd.Env = append(os.Environ(), "BERTH_URL="+d.URL)
	var o, e strings.Builder
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("berth %v did not finish: %v", args, ctx.Err())
	}
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return o.String(), e.String(), code
}
