package runc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"testing/synctest"
	"time"

	"github.com/berth-sandbox/berth/errdefs"
)

func TestRunscVerdict(t *testing.T) {
	cases := []struct {
		status        string
		alive, frozen bool
		want          string
		ask           bool
	}{
		{"running", true, false, "", true},
		{"created", true, false, "", true},
		{"creating", true, false, "", true},
		{"paused", true, false, "paused", false},
		{"running", false, false, "stopped", false},
		{"paused", false, false, "stopped", false},
		{"created", false, false, "stopped", false},
		{"running", true, true, "stopped", false},
		{"paused", true, true, "stopped", false},
		{"stopped", true, false, "stopped", false},
		{"stopped", false, false, "stopped", false},
		{"someday", true, false, "", true},
	}
	for _, c := range cases {
		got, ask := runscVerdict(c.status, c.alive, c.frozen)
		if got != c.want || ask != c.ask {
			t.Errorf("runscVerdict(%q, alive %v, frozen %v) = %q, ask %v; want %q, ask %v", c.status, c.alive, c.frozen, got, ask, c.want, c.ask)
		}
	}
}

// fakeHost is a runsc root, a /proc and a v1 freezer hierarchy in temp
// directories, behind a gVisor-mode Runtime.
type fakeHost struct {
	r                   *Runtime
	root, proc, freezer string
}

const fakeID = "sb1"

func newFakeHost(t *testing.T) *fakeHost {
	t.Helper()
	h := &fakeHost{root: t.TempDir(), proc: t.TempDir(), freezer: t.TempDir()}
	h.r = &Runtime{
		cfg:  Config{RuncRoot: h.root, CgroupParent: "berth-test", GVisor: &GVisor{}},
		log:  slog.New(slog.DiscardHandler),
		cg:   cgroupLayout{controllers: map[string]string{"freezer": h.freezer}},
		proc: h.proc,
	}
	return h
}

// record writes runsc's state file for fakeID.
func (h *fakeHost) record(t *testing.T, body string) {
	t.Helper()
	for _, suffix := range []string{".state", ".lock"} {
		if err := os.WriteFile(filepath.Join(h.root, fakeID+"_sandbox:"+fakeID+suffix), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// process makes /proc/<pid> with the given run state and command line.
func (h *fakeHost) process(t *testing.T, pid int, state byte, cmdline string) {
	t.Helper()
	dir := filepath.Join(h.proc, fmt.Sprint(pid))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	stat := fmt.Sprintf("%d (exe) odd) name) %c 1 %d %d 0 -1\n", pid, state, pid, pid)
	if err := os.WriteFile(filepath.Join(dir, "stat"), []byte(stat), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cmdline"), []byte(cmdline), 0o644); err != nil {
		t.Fatal(err)
	}
}

func (h *fakeHost) freeze(t *testing.T, state string) {
	t.Helper()
	dir := filepath.Join(h.freezer, h.r.cgroupsPath(fakeID))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "freezer.state"), []byte(state+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

const sentryCmdline = "runsc-sandbox\x00--root=/x\x00boot\x00"

// TestRunscState: a gVisor sandbox's state comes from runsc's state file
// and /proc, and only a running one with a live, unfrozen sentry costs a
// `runsc state`.
func TestRunscState(t *testing.T) {
	askRunning := func(ctx context.Context, id string) (runcState, bool, error) {
		return runcState{ID: id, Pid: 42, Status: "running"}, true, nil
	}
	cases := []struct {
		name       string
		record     string // "" for none
		pid        int
		proc       byte   // run state of /proc/<pid>, 0 for no such process
		cmdline    string // of /proc/<pid>
		freezer    string // "" for no freezer cgroup
		wantOK     bool
		wantStatus string
		wantPid    int
		wantAsked  bool
	}{
		{name: "no record", wantOK: false},
		{name: "running", record: `{"status":"running","goferPid":43,"sandbox":{"pid":42}}`, pid: 42, proc: 'S', cmdline: sentryCmdline,
			wantOK: true, wantStatus: "running", wantPid: 42, wantAsked: true},
		{name: "created", record: `{"status":"created","sandbox":{"pid":42}}`, pid: 42, proc: 'R', cmdline: sentryCmdline,
			wantOK: true, wantStatus: "running", wantPid: 42, wantAsked: true},
		{name: "paused", record: `{"status":"paused","sandbox":{"pid":42}}`, pid: 42, proc: 'S', cmdline: sentryCmdline,
			wantOK: true, wantStatus: "paused", wantPid: 42},
		{name: "running, sentry gone", record: `{"status":"running","sandbox":{"pid":42}}`,
			wantOK: true, wantStatus: "stopped"},
		{name: "paused, sentry gone", record: `{"status":"paused","sandbox":{"pid":42}}`,
			wantOK: true, wantStatus: "stopped"},
		{name: "running, sentry a zombie", record: `{"status":"running","sandbox":{"pid":42}}`, pid: 42, proc: 'Z', cmdline: "",
			wantOK: true, wantStatus: "stopped"},
		{name: "running, pid reused", record: `{"status":"running","sandbox":{"pid":42}}`, pid: 42, proc: 'S', cmdline: "bash\x00",
			wantOK: true, wantStatus: "stopped"},
		{name: "running, no sandbox recorded", record: `{"status":"running"}`,
			wantOK: true, wantStatus: "stopped"},
		{name: "running, frozen", record: `{"status":"running","sandbox":{"pid":42}}`, pid: 42, proc: 'D', cmdline: sentryCmdline, freezer: "FROZEN",
			wantOK: true, wantStatus: "stopped"},
		{name: "running, freezing", record: `{"status":"running","sandbox":{"pid":42}}`, pid: 42, proc: 'S', cmdline: sentryCmdline, freezer: "FREEZING",
			wantOK: true, wantStatus: "stopped"},
		{name: "paused, frozen", record: `{"status":"paused","sandbox":{"pid":42}}`, pid: 42, proc: 'S', cmdline: sentryCmdline, freezer: "FROZEN",
			wantOK: true, wantStatus: "stopped"},
		{name: "running, thawed", record: `{"status":"running","sandbox":{"pid":42}}`, pid: 42, proc: 'S', cmdline: sentryCmdline, freezer: "THAWED",
			wantOK: true, wantStatus: "running", wantPid: 42, wantAsked: true},
		{name: "stopped, sentry lingering", record: `{"status":"stopped","sandbox":{"pid":42}}`, pid: 42, proc: 'S', cmdline: sentryCmdline,
			wantOK: true, wantStatus: "stopped"},
		// A torn read that stays torn: runsc can still tell.
		{name: "unreadable", record: `{"status":"runn`, wantOK: true, wantStatus: "running", wantPid: 42, wantAsked: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := newFakeHost(t)
			if c.record != "" {
				h.record(t, c.record)
			}
			if c.proc != 0 {
				h.process(t, c.pid, c.proc, c.cmdline)
			}
			if c.freezer != "" {
				h.freeze(t, c.freezer)
			}
			asked := false
			ask := func(ctx context.Context, id string) (runcState, bool, error) {
				asked = true
				return askRunning(ctx, id)
			}
			st, ok, err := h.r.runscState(t.Context(), fakeID, ask, 0)
			if err != nil {
				t.Fatalf("runscState = %v", err)
			}
			if ok != c.wantOK || st.Status != c.wantStatus || st.Pid != c.wantPid {
				t.Errorf("runscState = %+v, ok %v; want status %q, pid %d, ok %v", st, ok, c.wantStatus, c.wantPid, c.wantOK)
			}
			if asked != c.wantAsked {
				t.Errorf("asked runsc = %v, want %v", asked, c.wantAsked)
			}
		})
	}
}

// TestRunscStateKept: with keep (Inspect), a live sandbox's `runsc state`
// answer serves while the state file and the sentry stay the same and the
// answer is younger than keep; a sandbox whose sentry went is stopped at
// once, whatever was kept; without keep, runsc is always asked. The
// sleeps run on the synctest bubble's virtual clock: they age the kept
// answer, nothing waits.
func TestRunscStateKept(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newFakeHost(t)
		h.record(t, `{"status":"running","sandbox":{"pid":42}}`)
		h.process(t, 42, 'S', sentryCmdline)
		asked := 0
		answer := runcState{ID: fakeID, Pid: 42, Status: "running"}
		ask := func(context.Context, string) (runcState, bool, error) {
			asked++
			return answer, true, nil
		}
		check := func(keep time.Duration, wantStatus string, wantAsked int) {
			t.Helper()
			st, ok, err := h.r.runscState(t.Context(), fakeID, ask, keep)
			if err != nil || !ok || st.Status != wantStatus {
				t.Errorf("runscState = %+v, %v, %v; want %s", st, ok, err, wantStatus)
			}
			if asked != wantAsked {
				t.Errorf("runsc asked %d times, want %d", asked, wantAsked)
			}
		}
		check(runscAnswerTTL, "running", 1)
		check(runscAnswerTTL, "running", 1) // kept
		check(0, "running", 2)              // the lifecycle paths ask
		// Virtual time (synctest): moves the bubble's clock past the
		// kept answer's age limit; the runtime has no event to wait on,
		// the answer only grows old.
		time.Sleep(runscAnswerTTL)
		check(runscAnswerTTL, "running", 3) // too old
		// Another runsc status (started after created): asked again.
		h.record(t, `{"status":"created","sandbox":{"pid":42}}`)
		check(runscAnswerTTL, "running", 4)
		// Another sentry (a restore): asked again.
		h.record(t, `{"status":"running","sandbox":{"pid":43}}`)
		h.process(t, 43, 'S', sentryCmdline)
		check(runscAnswerTTL, "running", 5)
		check(runscAnswerTTL, "running", 5)
		// The sentry exited: stopped, without runsc, kept answer or not.
		h.process(t, 43, 'Z', "")
		check(runscAnswerTTL, "stopped", 5)
		// An answer that the sandbox stopped is not kept.
		h.process(t, 43, 'S', sentryCmdline)
		answer.Status = "stopped"
		check(runscAnswerTTL, "running", 5) // still the kept one: same file, same sentry
		time.Sleep(runscAnswerTTL)          // virtual time, as above: ages the kept answer
		check(runscAnswerTTL, "stopped", 6)
		check(runscAnswerTTL, "stopped", 7)
	})
}

// TestRunscStateUnresponsive: a running sandbox whose sentry lives but
// whose `runsc state` never answers is errUnresponsive (ErrUnavailable)
// once askTimeout passes; the caller's own cancellation is the caller's.
func TestRunscStateUnresponsive(t *testing.T) {
	hang := func(ctx context.Context, _ string) (runcState, bool, error) {
		<-ctx.Done()
		return runcState{}, false, fmt.Errorf("runsc state: signal: killed")
	}
	synctest.Test(t, func(t *testing.T) {
		h := newFakeHost(t)
		h.record(t, `{"status":"running","sandbox":{"pid":42}}`)
		h.process(t, 42, 'S', sentryCmdline)
		_, ok, err := h.r.runscState(t.Context(), fakeID, hang, 0)
		if !errors.Is(err, errUnresponsive) || !errors.Is(err, errdefs.ErrUnavailable) || ok {
			t.Errorf("runscState on a hung runsc = ok %v, %v; want errUnresponsive (ErrUnavailable)", ok, err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		if _, _, err := h.r.runscState(ctx, fakeID, hang, 0); err == nil || errors.Is(err, errUnresponsive) {
			t.Errorf("runscState with a cancelled context = %v, want the ask's own error", err)
		}
	})
}

// TestReadRunscRecordTorn: a state file caught half written is read again.
func TestReadRunscRecordTorn(t *testing.T) {
	h := newFakeHost(t)
	h.record(t, `{"status":"paused","goferPid":43,"sandbox":{"pid":42,"controlSocketPath":"/run/runsc-sb1.sock"}}`)
	rec, ok, err := h.r.readRunscRecord(fakeID)
	if err != nil || !ok || rec.Status != "paused" || rec.GoferPid != 43 || rec.sentryPid() != 42 || rec.Sandbox.ControlSocketPath != "/run/runsc-sb1.sock" {
		t.Errorf("readRunscRecord = %+v, ok %v, %v", rec, ok, err)
	}
	h.record(t, ``)
	if _, ok, err := h.r.readRunscRecord(fakeID); err == nil || ok {
		t.Errorf("readRunscRecord of an empty file = ok %v, %v; want an error", ok, err)
	}
	if got := h.r.goferPid(fakeID); got != 0 {
		t.Errorf("goferPid of an unreadable record = %d, want 0", got)
	}
}

// TestParseRecordRetry: runsc rewrites its state file in place, so a read
// may see it truncated or half written; the second read gets the whole,
// and a third is never made.
func TestParseRecordRetry(t *testing.T) {
	cases := []struct {
		reads  []string
		ok     bool
		err    bool
		status string
	}{
		{reads: []string{`{"status":"paused"}`}, ok: true, status: "paused"},
		{reads: []string{``, `{"status":"paused"}`}, ok: true, status: "paused"},
		{reads: []string{`{"status":"pau`, `{"status":"running"}`}, ok: true, status: "running"},
		{reads: []string{`{"status":"pau`, ``, `{"status":"running"}`}, err: true},
	}
	for _, c := range cases {
		n := 0
		read := func() ([]byte, error) {
			if n >= len(c.reads) {
				t.Fatalf("reads %q: read %d times", c.reads, n+1)
			}
			n++
			return []byte(c.reads[n-1]), nil
		}
		rec, ok, err := parseRecord(read)
		if ok != c.ok || (err != nil) != c.err || rec.Status != c.status {
			t.Errorf("parseRecord(reads %q) = %+v, ok %v, %v; want status %q, ok %v, error %v", c.reads, rec, ok, err, c.status, c.ok, c.err)
		}
	}
	gone := func() ([]byte, error) { return nil, os.ErrNotExist }
	if _, ok, err := parseRecord(gone); ok || err != nil {
		t.Errorf("parseRecord(gone) = ok %v, %v; want no record, no error", ok, err)
	}
}
