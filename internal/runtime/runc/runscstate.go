package runc

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/berth-sandbox/berth/errdefs"
)

// A gVisor sandbox is inspected from runsc's state file and /proc, not by
// running `runsc state`, whenever they settle the answer. `runsc state`
// takes the container's flock without a timeout and, for a sandbox on
// record as created or running, asks the sentry over its control socket,
// also without a timeout. So it blocks behind any other runsc CLI holding
// the flock (a delete waits up to two minutes for a frozen sentry), and on
// a sentry that is alive but does not serve: frozen by a kill round a
// daemon SIGKILL cut short, or in the middle of a restore. Those are the
// sandboxes a restarted daemon needs to inspect, and to stop.
//
//	state file                  sentry            status
//	missing                     -                 no record (as runc's)
//	stopped                     any               stopped
//	created/running/paused      dead              stopped (runsc's CheckStopped would say so)
//	created/running/paused      alive, frozen     stopped: a kill was cut short; Stop finishes it
//	paused                      alive             paused
//	created/running             alive             `runsc state`, bounded by askTimeout;
//	                                              unanswered: errUnresponsive
//
// Berth never freezes a gVisor sandbox through the cgroup freezer (`runsc
// pause` pauses the sentry's own kernel), so a frozen sentry is one
// killRound froze and did not get to kill and thaw.

// errUnresponsive is why a gVisor sandbox could not be inspected: its
// sentry is alive but `runsc state` did not answer in time. Callers stop
// such a sandbox (the cgroup kill needs no answer) rather than fail it.
var errUnresponsive = fmt.Errorf("runsc unresponsive: %w", errdefs.ErrUnavailable)

// askTimeout bounds a `runsc state` that the state file could not spare:
// on a healthy sentry it answers in well under a second.
const askTimeout = 5 * time.Second

// runscRecord is the part of runsc's state file,
// <root>/<id>_sandbox:<id>.state, that Berth reads.
type runscRecord struct {
	Status   string `json:"status"`
	GoferPid int    `json:"goferPid"`
	Sandbox  *struct {
		Pid               int    `json:"pid"`
		ControlSocketPath string `json:"controlSocketPath"`
	} `json:"sandbox"`
}

// sentryPid is the sandbox (sentry) process's pid, 0 if none is recorded.
func (rec runscRecord) sentryPid() int {
	if rec.Sandbox == nil {
		return 0
	}
	return rec.Sandbox.Pid
}

// readRunscRecord reads runsc's state file of sandbox id; ok is false
// when there is none. runsc rewrites the file in place (truncate, then
// write) under a flock Berth does not take, so a read may catch it half
// written: it is read again once before that counts as an error.
func (r *Runtime) readRunscRecord(id string) (rec runscRecord, ok bool, err error) {
	var path string
	for _, f := range r.runscStateFiles(id) {
		if strings.HasSuffix(f, ".state") {
			path = f
			break
		}
	}
	if path == "" {
		return rec, false, nil
	}
	rec, ok, err = parseRecord(func() ([]byte, error) { return os.ReadFile(path) })
	if err != nil {
		return rec, false, fmt.Errorf("runsc state file %s: %w", path, err)
	}
	return rec, ok, nil
}

// parseRecord reads a state file with read, twice if the first read does
// not parse; ok is false if the file is gone.
func parseRecord(read func() ([]byte, error)) (rec runscRecord, ok bool, err error) {
	for try := 0; ; try++ {
		b, err := read()
		if errors.Is(err, os.ErrNotExist) {
			return rec, false, nil
		}
		if err != nil {
			return rec, false, err
		}
		rec = runscRecord{}
		err = json.Unmarshal(b, &rec)
		if err == nil {
			return rec, true, nil
		}
		if try > 0 {
			return rec, false, err
		}
	}
}

// procRoot is where /proc is: a seam for tests.
func (r *Runtime) procRoot() string {
	if r.proc != "" {
		return r.proc
	}
	return "/proc"
}

// sentryAlive reports whether pid is a live runsc sandbox process: it
// exists, is no zombie, and its command line says runsc-sandbox (runsc's
// name for it), which keeps a reused pid from passing.
func (r *Runtime) sentryAlive(pid int) bool {
	if pid <= 0 {
		return false
	}
	dir := filepath.Join(r.procRoot(), strconv.Itoa(pid))
	stat, err := os.ReadFile(filepath.Join(dir, "stat"))
	if err != nil {
		return false
	}
	// "pid (comm) S ...": the comm may hold spaces and parentheses.
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 || i+2 >= len(stat) {
		return false
	}
	if s := stat[i+2]; s == 'Z' || s == 'X' || s == 'x' {
		return false
	}
	cmdline, err := os.ReadFile(filepath.Join(dir, "cmdline"))
	return err == nil && bytes.HasPrefix(cmdline, []byte("runsc-sandbox"))
}

// cgroupFrozen reports whether sandbox id's cgroup is frozen, or being
// frozen, by the v1 freezer or v2's cgroup.freeze.
func (r *Runtime) cgroupFrozen(id string) bool {
	if fz := r.cg.controllers["freezer"]; fz != "" && !r.cg.v2 {
		b, err := os.ReadFile(filepath.Join(fz, r.cgroupsPath(id), "freezer.state"))
		if s := strings.TrimSpace(string(b)); err == nil && (s == "FROZEN" || s == "FREEZING") {
			return true
		}
	}
	if r.cg.unified != "" {
		b, err := os.ReadFile(filepath.Join(r.cg.unified, r.cgroupsPath(id), "cgroup.freeze"))
		if err == nil && strings.TrimSpace(string(b)) == "1" {
			return true
		}
	}
	return false
}

// runscVerdict maps what the state file says (status) and what the host
// says (the sentry alive, its cgroup frozen) to the status runsc would
// report, or ask when only runsc can tell (see the table above).
func runscVerdict(status string, alive, frozen bool) (verdict string, ask bool) {
	switch {
	case status == "stopped" || !alive || frozen:
		return "stopped", false
	case status == "paused":
		return "paused", false
	default: // creating, created, running or a status this code does not know
		return "", true
	}
}

// askFunc runs `runsc state` (Runtime.runcState); a seam for tests.
type askFunc func(ctx context.Context, id string) (runcState, bool, error)

// runscAnswerTTL is how long Inspect takes runsc's last answer about a
// live sandbox instead of asking again (runscState's keep). A `runsc
// state` is a runsc process, tens of milliseconds of CPU: asked by the
// monitor every second, it was most of what an idle gVisor sandbox cost
// the host (6 % of a core each, measured here; README). What a kept
// answer could miss is little: a sandbox's end shows without runsc, as
// its sentry exits with its init (gone, a zombie or frozen: stopped),
// and a new runsc status or sentry makes it ask again. Only a sentry
// that stopped answering stays unseen for that long; the lifecycle
// paths, which act on that (errUnresponsive), always ask.
const runscAnswerTTL = 30 * time.Second

// runscAnswer is an answer of `runsc state` about a sandbox whose sentry
// was alive, kept (Runtime.runscAnswers) with what the state file and
// /proc said when it was asked.
type runscAnswer struct {
	at     time.Time
	sentry int    // the sentry's pid
	file   string // the state file's status
	st     runcState
}

// runscState is state for a gVisor sandbox: from the state file and /proc
// where they settle it, else from ask, bounded by askTimeout, or from an
// answer of ask's kept for up to keep (0: ask again) while the state file
// and the sentry are the same. A sentry that does not answer in time gets
// errUnresponsive.
func (r *Runtime) runscState(ctx context.Context, id string, ask askFunc, keep time.Duration) (runcState, bool, error) {
	rec, ok, err := r.readRunscRecord(id)
	if err != nil {
		// A state file that will not parse (torn twice, or a format
		// this code does not know): runsc itself can still tell.
		r.log.Warn("runsc_state_file_unreadable", "sandbox_id", id, "err", err)
		return r.askBounded(ctx, id, ask)
	}
	if !ok {
		return runcState{}, false, nil
	}
	pid := rec.sentryPid()
	alive := r.sentryAlive(pid)
	frozen := alive && r.cgroupFrozen(id)
	verdict, mustAsk := runscVerdict(rec.Status, alive, frozen)
	if frozen {
		r.log.Info("sandbox_frozen_by_cut_kill", "sandbox_id", id, "sentry_pid", pid)
	}
	if mustAsk {
		if v, ok := r.runscAnswers.Load(id); ok && keep > 0 {
			if a := v.(runscAnswer); a.sentry == pid && a.file == rec.Status && time.Since(a.at) < keep {
				return a.st, true, nil
			}
		}
		st, ok, err := r.askBounded(ctx, id, ask)
		if err == nil && ok && st.Status != "stopped" {
			r.runscAnswers.Store(id, runscAnswer{at: time.Now(), sentry: pid, file: rec.Status, st: st})
		} else {
			r.runscAnswers.Delete(id)
		}
		return st, ok, err
	}
	st := runcState{ID: id, Status: verdict}
	if verdict != "stopped" {
		st.Pid = pid
	}
	return st, true, nil
}

// askBounded calls ask with askTimeout; running out of it (and only that:
// ctx's own end is ctx's error) is errUnresponsive.
func (r *Runtime) askBounded(ctx context.Context, id string, ask askFunc) (runcState, bool, error) {
	actx, cancel := context.WithTimeout(ctx, askTimeout)
	defer cancel()
	st, ok, err := ask(actx, id)
	if err != nil && ctx.Err() == nil && errors.Is(actx.Err(), context.DeadlineExceeded) {
		return st, false, fmt.Errorf("runsc state gave no answer within %v: %w", askTimeout, errUnresponsive)
	}
	return st, ok, err
}

// sentryGone reports whether sandbox id has runsc state whose sentry is
// no longer running, so that `runsc delete` has nothing left to do but
// remove files removeState removes too.
func (r *Runtime) sentryGone(id string) bool {
	rec, ok, err := r.readRunscRecord(id)
	return err == nil && ok && !r.sentryAlive(rec.sentryPid())
}
