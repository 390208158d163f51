package agent

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/berth-sandbox/berth/test/harness"
)

// TestHostPidsCgroupFork: with a workload cgroup the runtime made on the
// host (runc, cgroup v1), a process the agent starts is born in it and
// held to its limit, and no thread of the agent is left there.
func TestHostPidsCgroupFork(t *testing.T) {
	if os.Geteuid() != 0 || !harness.PidsV1() {
		t.Skip("needs root and a cgroup v1 pids hierarchy")
	}
	// Where this process is now, to go back to before the test's cgroups
	// are removed.
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	var home string
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.SplitN(l, ":", 3); len(f) == 3 && slices.Contains(strings.Split(f[1], ","), "pids") {
			home = filepath.Join("/sys/fs/cgroup/pids", f[2])
		}
	}
	if home == "" {
		t.Fatalf("no pids line in /proc/self/cgroup: %q", b)
	}
	sandbox := filepath.Join("/sys/fs/cgroup/pids", "berth-agent-test-"+strconv.Itoa(os.Getpid()))
	work := filepath.Join(sandbox, "workload")
	if err := os.MkdirAll(work, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.WriteFile(filepath.Join(home, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0); err != nil {
			t.Errorf("back to %s: %v", home, err)
		}
		for _, d := range []string{work, sandbox} {
			if err := unix.Rmdir(d); err != nil {
				t.Errorf("rmdir %s: %v", d, err)
			}
		}
	})
	// 2: the forking thread counts there while it forks (it is moved in
	// for the moment), so one process fits.
	if err := os.WriteFile(filepath.Join(work, "pids.max"), []byte("2"), 0); err != nil {
		t.Fatal(err)
	}
	open := func(dir string) *os.File {
		f, err := os.OpenFile(filepath.Join(dir, "tasks"), os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	cg := HostPidsCgroup(open(work), open(sandbox))
	defer cg.Close()

	first := exec.Command("sleep", "1000")
	if err := cg.fork(first.Start); err != nil {
		t.Fatalf("first start: %v", err)
	}
	defer func() {
		_ = first.Process.Kill()
		_ = first.Wait()
	}()
	procs := func(dir string) []int {
		out, err := harness.CgroupProcs(dir)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	if got := procs(work); !slices.Equal(got, []int{first.Process.Pid}) {
		t.Errorf("workload cgroup holds %v, want the started process %d alone", got, first.Process.Pid)
	}
	// The forking thread went back: the test process is in the sandbox
	// cgroup, not the workload's.
	if got := procs(sandbox); !slices.Contains(got, os.Getpid()) {
		t.Errorf("sandbox cgroup holds %v, want this process (%d)", got, os.Getpid())
	}
	// At the workload's limit the next start is refused, while the
	// sandbox cgroup has no limit of its own here.
	second := exec.Command("sleep", "1000")
	if err := cg.fork(second.Start); !errors.Is(err, unix.EAGAIN) {
		if err == nil {
			_ = second.Process.Kill()
			_ = second.Wait()
		}
		t.Errorf("second start at the workload's limit = %v, want EAGAIN", err)
	}
	if got := procs(work); !slices.Equal(got, []int{first.Process.Pid}) {
		t.Errorf("after the refused start the workload cgroup holds %v, want %d alone", got, first.Process.Pid)
	}
}
