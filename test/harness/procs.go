package harness

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// Proc is one live host process as /proc describes it.
type Proc struct {
	PID     int
	PPID    int
	UID     int    // real uid
	Comm    string // /proc/PID/comm
	Cmdline string
	Cgroup  string // /proc/PID/cgroup, every hierarchy
}

// Procs lists the host's live processes (zombies left out: a zombie holds
// nothing but its pid until its parent reaps it) that match keep. This is
// the one /proc walker of the test suites: for processes that may have
// left every cgroup, where no cgroup file can count them.
func Procs(keep func(Proc) bool) []Proc {
	var out []Proc
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		dir := filepath.Join("/proc", e.Name())
		st, err := os.ReadFile(filepath.Join(dir, "status"))
		if err != nil || strings.Contains(string(st), "State:\tZ") {
			continue
		}
		p := Proc{PID: pid, UID: -1}
		for _, line := range strings.Split(string(st), "\n") {
			f := strings.Fields(line)
			switch {
			case len(f) > 1 && f[0] == "Uid:":
				p.UID, _ = strconv.Atoi(f[1])
			case len(f) > 1 && f[0] == "PPid:":
				p.PPID, _ = strconv.Atoi(f[1])
			case len(f) > 1 && f[0] == "Name:":
				p.Comm = f[1]
			}
		}
		cmd, _ := os.ReadFile(filepath.Join(dir, "cmdline"))
		p.Cmdline = strings.TrimSpace(strings.ReplaceAll(string(cmd), "\x00", " "))
		cg, _ := os.ReadFile(filepath.Join(dir, "cgroup"))
		p.Cgroup = string(cg)
		if keep(p) {
			out = append(out, p)
		}
	}
	return out
}

// PID is the daemon process's pid, or 0 when it is not running.
func (d *Daemon) PID() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cmd == nil || d.cmd.Process == nil {
		return 0
	}
	return d.cmd.Process.Pid
}

// KeyUsers returns the host uids with kernel keys charged to them
// (/proc/key-users).
func KeyUsers(t testing.TB) map[int]bool {
	t.Helper()
	b, err := os.ReadFile("/proc/key-users")
	if err != nil {
		t.Skipf("no /proc/key-users: %v", err)
	}
	out := map[int]bool{}
	for _, line := range strings.Split(string(b), "\n") {
		if u, _, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			if n, err := strconv.Atoi(u); err == nil {
				out[n] = true
			}
		}
	}
	return out
}

// ProcUID is the real uid of a host process.
func ProcUID(pid int) (int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 1 && f[0] == "Uid:" {
			return strconv.Atoi(f[1])
		}
	}
	return 0, fmt.Errorf("no Uid in /proc/%d/status", pid)
}
