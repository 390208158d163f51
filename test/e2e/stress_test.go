package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/client"
)

// Output is never lost: thousands of short commands, 8 at a time, through
// the CLI and the Go SDK, each printing its own tokens on stdout and stderr
// and exiting with its own code, plus commands that print 1 MiB and exit at
// once. Every byte must arrive, in order, on the right stream, with the exact
// exit code. The E2B SDK's share runs in the Node suite (test/e2b,
// stress.test.mjs), which has the base template its bash needs.
//
// The quiet run is the bulk (3,600 commands here, 1,400 through the E2B
// SDK: 5,000); the run under a CPU hog on every core is a smaller batch
// (600 here, 200 there) of the same mix, since a hog makes each command
// several times slower and the suite must stay within minutes. The CLI's
// share is the smallest: each of its commands also starts a process.
const (
	stressSDK      = 2800
	stressCLI      = 800
	stressHogSDK   = 400
	stressHogCLI   = 200
	stressParallel = 8
	// Every stressBigEvery-th command prints 1 MiB.
	stressBigEvery = 50
	stressBig      = 1 << 20
)

func TestOutputNeverLost(t *testing.T) {
	d := StartDaemon(t)
	// Outlive the default 10 minutes on a crowded machine.
	sb := d.Create(t, client.CreateRequest{Timeout: "30m"})
	big := seqBytes(stressBig)

	t.Run("quiet", func(t *testing.T) {
		runStress(t, d, sb, big, "q", stressSDK, stressCLI)
	})
	t.Run("cpu-hog", func(t *testing.T) {
		startHog(t)
		runStress(t, d, sb, big, "h", stressHogSDK, stressHogCLI)
	})
	if err := d.Client.Kill(context.WithoutCancel(t.Context()), sb.ID); err != nil {
		t.Fatal(err)
	}
	AssertNoLeaks(t, d)
}

// stressCase is one command and what it must produce.
type stressCase struct {
	argv           []string
	stdout, stderr string
	code           int
}

// stressCmd builds the n-th command of a run: most print a token on each
// stream and exit with a code of their own; some are a bare echo (no shell:
// the fastest process there is); every stressBigEvery-th prints 1 MiB.
func stressCmd(prefix string, n int, big []byte) stressCase {
	tok := prefix + "-" + strconv.Itoa(n)
	switch {
	case n%stressBigEvery == 0:
		return stressCase{
			argv:   []string{"sh", "-c", "echo o-" + tok + "; seq 1 200000 | head -c " + strconv.Itoa(stressBig) + "; echo e-" + tok + " >&2"},
			stdout: "o-" + tok + "\n" + string(big),
			stderr: "e-" + tok + "\n",
		}
	case n%3 == 0:
		return stressCase{argv: []string{"echo", "o-" + tok}, stdout: "o-" + tok + "\n"}
	default:
		code := n % 5
		return stressCase{
			argv:   []string{"sh", "-c", "echo o-" + tok + "; echo e-" + tok + " >&2; exit " + strconv.Itoa(code)},
			stdout: "o-" + tok + "\n",
			stderr: "e-" + tok + "\n",
			code:   code,
		}
	}
}

// seqBytes is the first n bytes of `seq 1 200000`.
func seqBytes(n int) []byte {
	var b bytes.Buffer
	for i := 1; b.Len() < n; i++ {
		b.WriteString(strconv.Itoa(i))
		b.WriteByte('\n')
	}
	return b.Bytes()[:n]
}

// runStress runs sdk commands through the Go SDK and cli through the CLI,
// stressParallel at a time in all, and fails on any wrong byte or code.
func runStress(t *testing.T, d *Daemon, sb *client.Sandbox, big []byte, prefix string, sdk, cli int) {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	type job struct {
		n     int
		useCL bool
	}
	jobs := make(chan job)
	go func() {
		defer close(jobs)
		// Interleave the clients so both run throughout.
		for i, j := 0, 0; i < sdk || j < cli; {
			if i < sdk && (j >= cli || i*cli <= j*sdk) {
				jobs <- job{n: i, useCL: false}
				i++
			} else {
				jobs <- job{n: sdk + j, useCL: true}
				j++
			}
		}
	}()
	var failures atomic.Int32
	var mu sync.Mutex
	var report []string
	fail := func(format string, args ...any) {
		if failures.Add(1) > 20 {
			return
		}
		mu.Lock()
		report = append(report, fmt.Sprintf(format, args...))
		mu.Unlock()
	}
	var wg sync.WaitGroup
	start := time.Now()
	for range stressParallel {
		wg.Go(func() {
			for j := range jobs {
				if ctx.Err() != nil {
					continue
				}
				c := stressCmd(prefix, j.n, big)
				var out, errOut string
				var code int
				via := "sdk"
				if j.useCL {
					via = "cli"
					var err error
					out, errOut, code, err = cliExec(ctx, d, sb.ID, c.argv)
					if err != nil {
						fail("%s %q: %v", via, c.argv, err)
						continue
					}
				} else {
					var o, e bytes.Buffer
					var err error
					code, err = sb.Exec(ctx, client.ExecRequest{Cmd: c.argv[0], Args: c.argv[1:], Stdout: &o, Stderr: &e})
					if err != nil {
						fail("%s %q: %v", via, c.argv, err)
						continue
					}
					out, errOut = o.String(), e.String()
				}
				if out != c.stdout || errOut != c.stderr || code != c.code {
					fail("%s %q = stdout %s, stderr %q, exit %d; want stdout %s, stderr %q, exit %d",
						via, c.argv, summarize(out), errOut, code, summarize(c.stdout), c.stderr, c.code)
				}
			}
		})
	}
	wg.Wait()
	if ctx.Err() != nil {
		t.Fatalf("the run did not finish in time (%v)", ctx.Err())
	}
	t.Logf("%d commands (%d SDK, %d CLI, every %dth 1 MiB), %d at a time, in %v", sdk+cli, sdk, cli, stressBigEvery, stressParallel, time.Since(start).Round(time.Millisecond))
	if n := failures.Load(); n > 0 {
		t.Errorf("%d of %d commands lost or garbled output or their exit code; first ones:\n%s\n--- daemon log (tail) ---\n%s",
			n, sdk+cli, strings.Join(report, "\n"), tail(d.Logs(), 40))
	}
}

// cliExec runs `berth exec ID -- argv…` with an empty stdin.
func cliExec(ctx context.Context, d *Daemon, id string, argv []string) (string, string, int, error) {
	cmd := exec.CommandContext(ctx, bin.Berth, append([]string{"exec", id, "--"}, argv...)...)
	cmd.Env = append(cmd.Environ(), "BERTH_URL="+d.URL)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok && ee.ExitCode() >= 0 {
		return o.String(), e.String(), ee.ExitCode(), nil
	}
	return o.String(), e.String(), 0, err
}

// summarize shows short output whole and long output by size and ends.
func summarize(s string) string {
	if len(s) <= 80 {
		return strconv.Quote(s)
	}
	return fmt.Sprintf("%d bytes %q…%q", len(s), s[:20], s[len(s)-20:])
}

// startHog keeps every core of the host busy until the test ends: one
// busy-looping shell per CPU, killed (by pid) in cleanup.
func startHog(t *testing.T) {
	t.Helper()
	for range runtime.NumCPU() {
		cmd := exec.Command("sh", "-c", "while :; do :; done")
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
	}
}
