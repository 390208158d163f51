package agent

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	pb "github.com/berth-sandbox/berth/proto/process"
)

// TestPTYSignalsByAgent: with PTYSignals (gVisor), ^C typed into a PTY
// is taken out of the input and the agent sends SIGINT to the session's
// process groups: the shell's foreground command ends, the shell lives
// on and reads the next line, and its exit ends the process.
func TestPTYSignalsByAgent(t *testing.T) {
	e := newEnv(t, "")
	e.srv.procs.ptySignals = true
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	req := &pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/bin/sh"}, Pty: &pb.PTY{}, Tag: ptr("term")}
	stream, err := e.proc.Start(ctx, connect.NewRequest(req))
	if err != nil {
		t.Fatal(err)
	}
	if !stream.Receive() {
		t.Fatal(stream.Err())
	}
	sel := &pb.ProcessSelector{Selector: &pb.ProcessSelector_Tag{Tag: "term"}}
	send := func(s string) {
		t.Helper()
		if _, err := e.proc.SendInput(ctx, connect.NewRequest(&pb.SendInputRequest{Process: sel, Input: &pb.ProcessInput{Input: &pb.ProcessInput_Pty{Pty: []byte(s)}}})); err != nil {
			t.Fatal(err)
		}
	}
	var out string
	readUntil := func(want string) {
		t.Helper()
		for !strings.Contains(out, want) {
			if !stream.Receive() {
				t.Fatalf("stream ended before %q; got %q (%v)", want, out, stream.Err())
			}
			out += string(stream.Msg().GetEvent().GetData().GetPty())
		}
	}
	// It prints once it is the foreground process (its own group, default
	// SIGINT), so the ^C cannot race its start.
	send("sh -c 'echo sl\"\"eeping; exec sleep 100'\n")
	readUntil("sleeping\r\n")
	send("\x03echo after-ctrl''c\n")
	readUntil("after-ctrlc")
	send("exit 3\n")
	r := collect(t, stream, func() *pb.ProcessEvent { return stream.Msg().GetEvent() })
	if r.end.GetExitCode() != 3 {
		t.Errorf("pty end = %v, want exit 3 (output %q)", r.end, out)
	}
}

// TestSessionGroups reads process groups of one session from a procfs,
// with process names that hold spaces and parentheses.
func TestSessionGroups(t *testing.T) {
	proc := t.TempDir()
	for pid, stat := range map[string]string{
		"10":   "10 (sh) S 1 10 10 0 0",
		"11":   "11 (sleep) S 10 11 10 0 0",
		"12":   "12 (we) ird) (x) S 10 11 10 0 0",
		"13":   "13 (other) S 1 13 13 0 0",
		"self": "13 (other) S 1 13 13 0 0",
		"14":   "garbage",
	} {
		if err := os.MkdirAll(filepath.Join(proc, pid), 0o755); err != nil {
			t.Fatal(err)
		}
		writeTestFile(t, filepath.Join(proc, pid, "stat"), stat)
	}
	got := sessionGroups(proc, 10)
	slices.Sort(got)
	if !slices.Equal(got, []int{10, 11}) {
		t.Errorf("sessionGroups(10) = %v, want [10 11]", got)
	}
	if got := sessionGroups(proc, 99); !slices.Equal(got, []int{99}) {
		t.Errorf("sessionGroups(99) = %v, want [99] (the leader's own group)", got)
	}
}
