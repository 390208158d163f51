package hostile

import (
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
func TestTeardownEscape(t *testing.T) {
	l := newLab(t, client.CreateRequest{})
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
		harness.WaitFor(t, time.Minute, "escapee "+escapees[i].name+" to run", func() bool { return len(hostProcsWith(want)) > 0 })
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
