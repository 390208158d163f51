package agent

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	pb "github.com/berth-sandbox/berth/proto/process"
	"github.com/berth-sandbox/berth/test/harness"
)

// TestDrainReadsWhatThePipeHolds: a reader that comes to the pipe after the
// drain deadline passed (it was blocked publishing to a slow stream, or not
// scheduled on a loaded CPU) still reads everything the process left there.
// A read whose deadline is past fails before it reads, so the deadline alone
// used to drop those bytes.
func TestDrainReadsWhatThePipeHolds(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	want := bytes.Repeat([]byte("0123456789abcdef"), 60000/16)
	if _, err := w.Write(want); err != nil {
		t.Fatal(err)
	}
	w.Close()
	// As startProc does when the process exits, drainGrace before now.
	if err := r.SetReadDeadline(time.Now().Add(-drainGrace)); err != nil {
		t.Fatal(err)
	}
	got := drain(t, r)
	if !bytes.Equal(got, want) {
		t.Errorf("read %d bytes after the deadline, want all %d", len(got), len(want))
	}
}

// TestDrainEndsDespiteAWriter: a grandchild that inherited the pipe and
// keeps writing cannot hold the readers (and so the end event) forever.
func TestDrainEndsDespiteAWriter(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		defer w.Close()
		buf := make([]byte, 4096)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := w.Write(buf); err != nil {
				return
			}
		}
	}()
	if err := r.SetReadDeadline(time.Now().Add(-drainGrace)); err != nil {
		t.Fatal(err)
	}
	got := drain(t, r)
	if limit := pipeCapacity(r) + outputChunk; len(got) > limit {
		t.Errorf("read %d bytes after the deadline, want at most %d", len(got), limit)
	}
}

// drain runs one output reader on r with a subscriber and returns what it
// published, failing if the reader does not finish.
func drain(t *testing.T, r *os.File) []byte {
	t.Helper()
	p := &proc{subs: map[chan *pb.ProcessEvent]struct{}{}, endedCh: make(chan struct{})}
	ch := p.subscribe()
	p.readers.Add(1)
	done := make(chan struct{})
	go func() {
		p.readOutput(r, "stdout")
		close(done)
	}()
	var got []byte
	for {
		select {
		case ev := <-ch:
			got = append(got, ev.GetData().GetStdout()...)
			continue
		case <-done:
		case <-time.After(30 * time.Second):
			t.Fatal("the output reader did not finish")
		}
		break
	}
	for {
		select {
		case ev := <-ch:
			got = append(got, ev.GetData().GetStdout()...)
			continue
		default:
		}
		return got
	}
}

// TestTimeoutKillsGroupWith124: timeout_ms kills the process and its group
// at the limit and ends it with exit code 124, as coreutils' timeout does.
func TestTimeoutKillsGroupWith124(t *testing.T) {
	e := newEnv(t, "")
	req := sh("sleep 300 & echo $!; wait")
	req.TimeoutMs = ptr(uint32(300))
	r := e.run(t, "", req)
	if r.end.GetExitCode() != timeoutExitCode || r.end.GetExited() || r.end.GetStatus() != "timed out after 300ms" || r.end.Error == nil {
		t.Errorf("end = %v, want exit code 124, status \"timed out after 300ms\"", r.end)
	}
	waitGone(t, atoiT(t, r.stdout))

	// A command that ends in time keeps its own code.
	req = sh("exit 3")
	req.TimeoutMs = ptr(uint32(60_000))
	if r := e.run(t, "", req); r.end.GetExitCode() != 3 {
		t.Errorf("end = %v, want exit 3", r.end)
	}
}

// TestConnectDeadlineLimitsProcess: like envd, the agent makes a Start
// request's Connect deadline the process's time limit, reported as the
// signal that ended it.
func TestConnectDeadlineLimitsProcess(t *testing.T) {
	e := newEnv(t, "")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	sctx, scancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer scancel()
	stream, err := e.proc.Start(sctx, connect.NewRequest(sh("echo $$; exec sleep 300")))
	if err != nil {
		t.Fatal(err)
	}
	pid := readPID(t, stream)
	for stream.Receive() {
	}
	waitGone(t, pid)
	harness.WaitFor(t, 20*time.Second, "the process to leave the agent's table", func() bool {
		list, err := e.proc.List(ctx, connect.NewRequest(&pb.ListRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range list.Msg.GetProcesses() {
			if int(p.GetPid()) == pid {
				return false
			}
		}
		return true
	})
}

// TestConnectDeadlineEndsStreamWithError: when the Connect deadline passes
// first, the stream ends with deadline_exceeded rather than cleanly, so the
// client (which may not have noticed the deadline yet: the E2B SDK's own
// timer races the agent's) reports a timeout, not a process that ended
// without a result. The client here sends the header but keeps no timer
// of its own, so only the agent can end the stream.
func TestConnectDeadlineEndsStreamWithError(t *testing.T) {
	e := newEnv(t, "")
	// No deadline on ctx: the client would send its own header instead.
	// The cancel after a generous bound only keeps a broken agent from
	// hanging the test; it ends the stream as canceled, which fails below.
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	defer time.AfterFunc(30*time.Second, cancel).Stop()
	req := connect.NewRequest(sh("echo $$; exec sleep 300"))
	req.Header().Set("Connect-Timeout-Ms", "300")
	stream, err := e.proc.Start(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	pid := readPID(t, stream)
	for stream.Receive() {
		if end := stream.Msg().GetEvent().GetEnd(); end != nil {
			t.Errorf("got an end event %v; want the stream to end with deadline_exceeded first", end)
		}
	}
	if code := connect.CodeOf(stream.Err()); code != connect.CodeDeadlineExceeded {
		t.Errorf("stream ended with %v (code %v), want deadline_exceeded", stream.Err(), code)
	}
	waitGone(t, pid)
}

// TestKillOnDisconnect: a Start stream with kill_on_disconnect takes its
// process group down when the client goes away; without it (envd's way,
// and background commands) the process runs on.
func TestKillOnDisconnect(t *testing.T) {
	e := newEnv(t, "")
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()

	start := func(kill bool) (pid, child int, stop func()) {
		t.Helper()
		sctx, scancel := context.WithCancel(ctx)
		req := sh("sleep 300 & echo $$ $!; wait")
		req.KillOnDisconnect = &kill
		stream, err := e.proc.Start(sctx, connect.NewRequest(req))
		if err != nil {
			t.Fatal(err)
		}
		var out string
		for !strings.Contains(out, "\n") && stream.Receive() {
			out += string(stream.Msg().GetEvent().GetData().GetStdout())
		}
		f := strings.Fields(out)
		if len(f) != 2 {
			t.Fatalf("output %q, want two pids (%v)", out, stream.Err())
		}
		return atoiT(t, f[0]), atoiT(t, f[1]), func() { scancel(); stream.Close() }
	}

	pid, child, stop := start(true)
	stop()
	waitGone(t, pid)
	waitGone(t, child)

	pid, child, stop = start(false)
	stop()
	// Wait until the agent let go of the stream (its subscription is gone)
	// before checking that the process outlived it.
	p, err := e.srv.procs.find(&pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: uint32(pid)}})
	if err != nil {
		t.Fatal(err)
	}
	harness.WaitFor(t, 20*time.Second, "the agent to drop the closed stream", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return len(p.subs) == 0
	})
	for _, q := range []int{pid, child} {
		if err := unix.Kill(q, 0); err != nil {
			t.Errorf("process %d of a stream without kill_on_disconnect: %v, want it running", q, err)
		}
	}
	_ = p.signal(unix.SIGKILL)
	waitGone(t, pid)
}

func readPID(t *testing.T, stream interface {
	Receive() bool
	Msg() *pb.StartResponse
	Err() error
}) int {
	t.Helper()
	var out string
	for !strings.Contains(out, "\n") && stream.Receive() {
		out += string(stream.Msg().GetEvent().GetData().GetStdout())
	}
	return atoiT(t, strings.TrimSpace(out))
}

func atoiT(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil {
		t.Fatalf("pid %q: %v", s, err)
	}
	return n
}

// waitGone waits until pid is no process or only a zombie (the agent is not
// PID 1 here, so an orphan waits for init to reap it).
func waitGone(t *testing.T, pid int) {
	t.Helper()
	harness.WaitFor(t, 20*time.Second, "process "+strconv.Itoa(pid)+" to be gone", func() bool {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if errors.Is(err, os.ErrNotExist) {
			return true
		}
		// The state follows the parenthesised command name.
		i := bytes.LastIndexByte(b, ')')
		return err == nil && i > 0 && i+2 < len(b) && b[i+2] == 'Z'
	})
}

// TestPumpLimitBeforeContext: the limit a Start stream's Connect deadline
// set can kill the process before the context's own timer has run (each
// runs on a goroutine of its own); the stream still ends with
// deadline_exceeded, while another stream on the process (Connect) gets
// the end event.
func TestPumpLimitBeforeContext(t *testing.T) {
	for _, own := range []bool{true, false} {
		p := &proc{endedCh: make(chan struct{}), timedOut: true}
		end := &pb.ProcessEvent{Event: &pb.ProcessEvent_End{End: &pb.ProcessEvent_EndEvent{Status: "signal: killed"}}}
		p.finish(end)
		var sent []*pb.ProcessEvent
		err := pump(t.Context(), p, make(chan *pb.ProcessEvent), time.Hour, own, func(ev *pb.ProcessEvent) error {
			sent = append(sent, ev)
			return nil
		})
		if own {
			if code := connect.CodeOf(err); code != connect.CodeDeadlineExceeded || len(sent) != 0 {
				t.Errorf("own deadline: err %v (code %v), sent %v; want deadline_exceeded and nothing sent", err, code, sent)
			}
			continue
		}
		if err != nil || len(sent) != 1 || sent[0] != end {
			t.Errorf("another stream: err %v, sent %v; want the end event", err, sent)
		}
	}
}
