package runc

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// AgentLogTail quotes the last three lines of the agent's log, reads no
// more than its last KiB, and follows no link.
func TestAgentLogTail(t *testing.T) {
	r := &Runtime{cfg: Config{StateDir: t.TempDir()}}
	const id = "rtlogtail1"
	if got := r.AgentLogTail(id); got != "" {
		t.Errorf("no log: %q, want empty", got)
	}
	if err := os.MkdirAll(r.diskDir(id), 0o755); err != nil {
		t.Fatal(err)
	}
	log := strings.Repeat("x", 4096) + "\none\ntwo\nthree\nfour\n"
	if err := os.WriteFile(r.AgentLog(id), []byte(log), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := r.AgentLogTail(id); got != "two | three | four" {
		t.Errorf("tail = %q, want the last three lines", got)
	}
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte("host secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	os.Remove(r.AgentLog(id))
	if err := os.Symlink(secret, r.AgentLog(id)); err != nil {
		t.Fatal(err)
	}
	if got := r.AgentLogTail(id); got != "" {
		t.Errorf("tail through a symlink = %q, want empty", got)
	}
	if got := r.AgentLogTail("../../etc"); got != "" {
		t.Errorf("tail of a bad ID = %q, want empty", got)
	}
}

// runcInit reads the init's pid from runc's state file and checks it
// against the process's start time: the same process is known and
// running, a number now held by a later process or by none is known and
// ended, and a missing or unreadable file (or gVisor) is not known.
func TestRuncInit(t *testing.T) {
	r := &Runtime{cfg: Config{RuncRoot: t.TempDir()}, proc: t.TempDir()}
	const id = "rtinit1"
	state := func(body string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Join(r.cfg.RuncRoot, id), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(r.cfg.RuncRoot, id, "state.json"), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	proc := func(pid, stat string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Join(r.proc, pid), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(r.proc, pid, "stat"), []byte(stat), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// Field 22 is 7345702; the command name holds a space and a ')'.
	const stat = "4242 (runc:[2:IN) IT]) S 1 4242 4242 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 7345702 1000 10 184467\n"
	check := func(name string, wantPid int, wantKnown bool) {
		t.Helper()
		if pid, known := r.runcInit(id); pid != wantPid || known != wantKnown {
			t.Errorf("%s: runcInit = %d, %v; want %d, %v", name, pid, known, wantPid, wantKnown)
		}
	}
	check("no state file", 0, false)
	state(`{"id":"rtinit1","init_process_pid":4242,"init_process_start":7345702}`)
	check("no such process", 0, true)
	proc("4242", stat)
	check("the init", 4242, true)
	state(`{"id":"rtinit1","init_process_pid":4242,"init_process_start":7345700}`)
	check("a later process with its number", 0, true)
	state(`{"id":"rtinit1","init_pro`)
	check("a torn file", 0, false)
	state(`{"id":"rtinit1","init_process_pid":4242,"init_process_start":7345702}`)
	proc("4242", "4242 (x) S 1 2\n")
	check("an unreadable stat", 0, false)
	proc("4242", stat)
	r.cfg.GVisor = &GVisor{}
	check("gVisor", 0, false)
}

// runcStateFromFile answers as `runc state` would from runc's state file,
// /proc and the freezer: running, created while the exec fifo is there,
// paused while the cgroup is frozen, stopped once the init is gone, a
// zombie or another process; a missing file is left to runc.
func TestRuncStateFromFile(t *testing.T) {
	fz := t.TempDir()
	r := &Runtime{cfg: Config{RuncRoot: t.TempDir(), CgroupParent: "berth-x"}, proc: t.TempDir(),
		cg: cgroupLayout{controllers: map[string]string{"freezer": fz}}}
	const id = "rtstate1"
	write := func(path, body string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	check := func(name, want string, wantPid int, wantSettled bool) {
		t.Helper()
		st, settled := r.runcStateFromFile(id)
		if settled != wantSettled || st.Status != want || st.Pid != wantPid || (settled && st.ID != id) {
			t.Errorf("%s: %+v, settled %v; want %q pid %d, settled %v", name, st, settled, want, wantPid, wantSettled)
		}
	}
	check("no state file", "", 0, false)
	write(filepath.Join(r.cfg.RuncRoot, id, "state.json"), `{"id":"rtstate1","init_process_pid":4242,"init_process_start":7345702}`)
	check("init gone", "stopped", 0, true)
	const stat = "4242 (berth-agent) S 1 4242 4242 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 7345702 1000 10 184467\n"
	write(filepath.Join(r.proc, "4242", "stat"), stat)
	check("init running", "running", 4242, true)
	write(filepath.Join(r.cfg.RuncRoot, id, "exec.fifo"), "")
	check("not started", "created", 4242, true)
	if err := os.Remove(filepath.Join(r.cfg.RuncRoot, id, "exec.fifo")); err != nil {
		t.Fatal(err)
	}
	write(filepath.Join(fz, "berth-x", id, "freezer.state"), "FROZEN\n")
	check("frozen", "paused", 4242, true)
	write(filepath.Join(fz, "berth-x", id, "freezer.state"), "THAWED\n")
	check("thawed", "running", 4242, true)
	write(filepath.Join(r.proc, "4242", "stat"), strings.Replace(stat, ") S ", ") Z ", 1))
	check("init a zombie", "stopped", 0, true)
	write(filepath.Join(r.proc, "4242", "stat"), strings.Replace(stat, "7345702", "7345999", 1))
	check("another process with its number", "stopped", 0, true)
}
