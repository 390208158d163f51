package hostile

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/test/harness"
)

// TestTeardownEscape starts processes that try to outlive their sandbox:
// double-forked, setsid, nohup'd and signal-ignoring ones, and a respawner.
// Destroy must leave none of them on the host.
// Under gVisor the escapees are tasks of the sentry, not host processes:
// they are seen running from inside, and destroy must leave none of the
// sandbox's host processes (sentry, gofer, ptrace stubs).
func TestTeardownEscape(t *testing.T) {
	harness.ForEachIsolation(t, testTeardownEscape)
}

func testTeardownEscape(t *testing.T, iso string) {
	l := newLab(t, client.CreateRequest{Isolation: iso})
	gvisor := iso == client.IsolationGVisor
	marker := "9" + strconv.Itoa(int(time.Now().UnixNano()%100000))
	escapees := []struct{ name, script string }{
		{"double-fork", "(sleep " + marker + "1 &) &"},
		{"setsid", "setsid sleep " + marker + "2 &"},
		{"ignore-signals", `sh -c 'trap "" TERM HUP INT QUIT; sleep ` + marker + `3; :' >/dev/null 2>&1 &`},
		{"respawner", `(while :; do (sleep ` + marker + `4 &); sleep 0.2; done) >/dev/null 2>&1 &`},
		{"new-process-group", `sh -c 'set -m; sleep ` + marker + `5 &' &`},
	}
	for _, e := range escapees {
		harness.MustRun(t, l.sb, e.script)
	}
	for i := range escapees {
		want := marker + strconv.Itoa(i+1)
		harness.WaitFor(t, time.Minute, "escapee "+escapees[i].name+" to run", func() bool {
			if gvisor {
				o, _, _ := harness.Run(t, l.sb, "ps -o args | grep -v grep | grep -c 'sleep "+want+"'")
				return strings.TrimSpace(o) != "0"
			}
			return len(hostProcsWith(want)) > 0
		})
	}
	var sandboxProcs []int
	if gvisor {
		sandboxProcs = sandboxPids(t, l.d, l.sb.ID)
	}
	if err := l.sb.Kill(t.Context()); err != nil {
		t.Fatalf("destroy: %v", err)
	}
	for i, e := range escapees {
		t.Run(e.name, func(t *testing.T) {
			if ps := hostProcsWith(marker + strconv.Itoa(i+1)); len(ps) > 0 {
				t.Errorf("survived destroy: %v", ps)
			}
		})
	}
	for _, pid := range sandboxProcs {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
			if c, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); strings.Contains(string(c), l.sb.ID) || strings.Contains(string(c), "runsc") {
				t.Errorf("host process %d of the gVisor sandbox survived destroy: %q", pid, c)
			}
		}
	}
	if !l.d.CgroupGone(l.sb.ID) {
		t.Errorf("the destroyed sandbox's cgroup is still there")
	}
	l.check(t)
}

// hostProcsWith lists host processes whose command line contains s. The
// escapees may have left the sandbox's cgroup (that is the attack), so
// only a walk of every host process can find them.
func hostProcsWith(s string) []string {
	var out []string
	for _, p := range harness.Procs(func(p harness.Proc) bool { return strings.Contains(p.Cmdline, s) }) {
		out = append(out, strconv.Itoa(p.PID)+" "+p.Cmdline)
	}
	return out
}
