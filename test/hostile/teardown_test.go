package hostile

import (
	"os"
	"path/filepath"
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
		harness.WaitFor(t, 10*time.Second, "escapee "+escapees[i].name+" to run", func() bool { return len(hostProcsWith(want)) > 0 })
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
	if n := sandboxProcs(l.d, l.sb.ID); n > 0 {
		t.Errorf("%d processes left in the destroyed sandbox's cgroup", n)
	}
	l.check(t)
}

// hostProcsWith lists host processes whose command line contains s.
func hostProcsWith(s string) []string {
	var out []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		cmd, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if c := strings.ReplaceAll(string(cmd), "\x00", " "); strings.Contains(c, s) {
			out = append(out, e.Name()+" "+c)
		}
	}
	return out
}
