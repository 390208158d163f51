package agent

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// PTY signals under a sentry that does not make them.
//
// Linux's line discipline turns the terminal's INTR, QUIT and SUSP
// characters (^C, ^\, ^Z) typed into a PTY into SIGINT, SIGQUIT and SIGTSTP
// for the terminal's foreground process group, when the terminal's ISIG
// flag is on. gVisor's sentry did not until 2023-02 (gVisor PR 8562; Debian
// 12's runsc is 20221219): it queues ^C as an ordinary byte, so a shell's
// foreground command runs on and the typed line after it waits behind it.
// With Config.PTYSignals (the gVisor runtime sets it) the agent does the
// line discipline's part for the input it writes: each such character is
// taken out of the input and its signal sent instead. The agent cannot ask
// the sentry which process group is in the foreground (TIOCGPGRP answers
// only a process whose controlling terminal it is), so the signal goes to
// every process group of the PTY's session: the foreground job, and the
// shell, which catches SIGINT and ignores SIGTSTP and SIGQUIT when
// interactive. A job-control shell's background jobs are in that session
// too and get it as well (docs/security.md, gVisor).

// writeTTY writes input to the process's PTY, with the line discipline's
// signal characters turned into signals when the agent makes them.
func (p *proc) writeTTY(b []byte) error {
	if !p.ptySignals {
		_, err := p.tty.Write(b)
		return err
	}
	sigs := p.ttySignalChars()
	for len(b) > 0 {
		i := slices.IndexFunc(b, func(c byte) bool { return sigs[c] != 0 })
		if i < 0 {
			_, err := p.tty.Write(b)
			return err
		}
		if i > 0 {
			if _, err := p.tty.Write(b[:i]); err != nil {
				return err
			}
		}
		p.signalSession(sigs[b[i]])
		b = b[i+1:]
	}
	return nil
}

// ttySignalChars maps the terminal's signal characters to their signals:
// none when its ISIG flag is off (a raw-mode program reads ^C itself).
func (p *proc) ttySignalChars() map[byte]unix.Signal {
	tio, err := getTermios(p.tty)
	if err != nil || tio.Lflag&unix.ISIG == 0 {
		return nil
	}
	m := map[byte]unix.Signal{}
	for _, c := range []struct {
		idx int
		sig unix.Signal
	}{{unix.VINTR, unix.SIGINT}, {unix.VQUIT, unix.SIGQUIT}, {unix.VSUSP, unix.SIGTSTP}} {
		// 0 is _POSIX_VDISABLE: that character is off.
		if ch := tio.Cc[c.idx]; ch != 0 {
			m[ch] = c.sig
		}
	}
	return m
}

// signalSession sends sig to every process group of the PTY's session
// (the session its process leads: the agent started it with setsid).
func (p *proc) signalSession(sig unix.Signal) {
	for _, pgid := range sessionGroups("/proc", p.pid) {
		_ = unix.Kill(-pgid, sig) // a group that just ended
	}
}

// sessionGroups lists the process groups of session sid from procfs.
func sessionGroups(proc string, sid int) []int {
	ents, err := os.ReadDir(proc)
	if err != nil {
		return []int{sid}
	}
	seen := map[int]bool{}
	out := []int{}
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		pgid, s, ok := statGroups(filepath.Join(proc, e.Name(), "stat"))
		if !ok || s != sid || seen[pgid] {
			continue
		}
		seen[pgid] = true
		out = append(out, pgid)
	}
	if len(out) == 0 {
		out = append(out, sid)
	}
	return out
}

// statGroups reads the process group and session from a /proc/<pid>/stat
// ("pid (comm) state ppid pgrp session ..."); comm may hold spaces and
// parentheses, so the fields are counted from its last ')'.
func statGroups(path string) (pgid, sid int, ok bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, 0, false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, 0, false
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 4 {
		return 0, 0, false
	}
	pgid, err1 := strconv.Atoi(f[2])
	sid, err2 := strconv.Atoi(f[3])
	return pgid, sid, err1 == nil && err2 == nil
}
