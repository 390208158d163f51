package client

import (
	"context"
	"fmt"
	"io"
	"math"
	"time"

	"connectrpc.com/connect"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/proto/process"
)

// ExecRequest describes a command to run in a sandbox. Cmd is the program
// (looked up in PATH) and Args its arguments; no shell is involved unless
// Cmd is one ("/bin/sh", Args ["-c", "…"]).
type ExecRequest struct {
	Cmd  string
	Args []string
	Env  map[string]string
	Cwd  string
	// User runs the command as this user; empty means the handle's user.
	User string
	// Stdin, when non-nil, is forwarded to the command, then closed at EOF.
	// When nil the command's stdin is empty.
	Stdin io.Reader
	// Stdout and Stderr receive the output as it arrives; nil discards.
	Stdout, Stderr io.Writer
	// Tag names the process so it can be selected by tag later.
	Tag string
	// Timeout, when positive, is the command's time limit: the agent kills
	// its process group when it passes and the command ends with exit code
	// 124, as under coreutils' timeout. It is counted from the start in the
	// sandbox and holds for background commands too. At most 49 days
	// (whole milliseconds travel on the wire).
	Timeout time.Duration
}

// maxTimeout is the longest Timeout the wire's uint32 milliseconds carry.
const maxTimeout = time.Duration(math.MaxUint32) * time.Millisecond

// stdinChunk is how much stdin goes in one SendInput call.
const stdinChunk = 32 << 10

// ProcessInfo describes a running process.
type ProcessInfo struct {
	PID  uint32            `json:"pid"`
	Tag  string            `json:"tag,omitempty"`
	Cmd  string            `json:"cmd"`
	Args []string          `json:"args"`
	Env  map[string]string `json:"env,omitempty"`
	Cwd  string            `json:"cwd,omitempty"`
}

func (r *ExecRequest) startRequest() (*process.StartRequest, error) {
	if r.Cmd == "" {
		return nil, fmt.Errorf("exec: command is empty: %w", errdefs.ErrInvalidArgument)
	}
	// stdin must be false unless we will feed it: unset means true for old
	// clients, and a process whose stdin stays open may wait for it forever.
	stdin := r.Stdin != nil
	req := &process.StartRequest{
		Process: &process.ProcessConfig{Cmd: r.Cmd, Args: r.Args, Envs: r.Env},
		Stdin:   &stdin,
	}
	switch {
	case r.Timeout < 0 || r.Timeout > maxTimeout:
		return nil, &errdefs.Error{Code: errdefs.CodeInvalidArgument, Field: "timeout",
			Message: fmt.Sprintf("exec: timeout %v: want 0 (none) up to %v", r.Timeout, maxTimeout)}
	case r.Timeout > 0:
		// Round up: a limit shorter than a millisecond is still a limit.
		ms := uint32((r.Timeout + time.Millisecond - 1) / time.Millisecond)
		req.TimeoutMs = &ms
	}
	if r.Cwd != "" {
		req.Process.Cwd = &r.Cwd
	}
	if r.Tag != "" {
		req.Tag = &r.Tag
	}
	return req, nil
}

// Exec runs a command and waits for it, streaming its output to
// req.Stdout and req.Stderr as it arrives. The exit code is the command's,
// 128+n when signal n ended it, or 124 when req.Timeout passed. The command
// lives only as long as its caller waits: when ctx is cancelled or its
// deadline passes, or the connection to the daemon drops, the agent kills
// the command's process group (and Exec returns ctx's error).
func (s *Sandbox) Exec(ctx context.Context, req ExecRequest) (int, error) {
	pc, err := s.processClient()
	if err != nil {
		return -1, err
	}
	sr, err := req.startRequest()
	if err != nil {
		return -1, err
	}
	kill := true
	sr.KillOnDisconnect = &kill
	user := s.userOr(req.User)
	creq := connect.NewRequest(sr)
	setHeaders(creq.Header(), user)

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := pc.Start(ctx, creq)
	if err != nil {
		return -1, agentError(err)
	}
	defer stream.Close()
	return receive(stream, cancel, req.Stdout, req.Stderr, func(pid uint32) {
		if req.Stdin != nil {
			// Not waited for: Read on a terminal or pipe can block past the
			// command's end, and cancelling ctx stops the forwarding calls.
			go forwardStdin(ctx, pc, pid, user, req.Stdin)
		}
	})
}

// receive reads a process's events until its end event and returns its
// exit code. onStart runs once with the pid. cancel ends the stream's
// context; receive uses it to bound what it reads after the end event.
func receive[T interface{ GetEvent() *process.ProcessEvent }](stream interface {
	Receive() bool
	Msg() T
	Err() error
}, cancel context.CancelFunc, stdout, stderr io.Writer, onStart func(pid uint32)) (int, error) {
	for stream.Receive() {
		ev := stream.Msg().GetEvent()
		switch e := ev.GetEvent().(type) {
		case *process.ProcessEvent_Start:
			if onStart != nil {
				onStart(e.Start.GetPid())
			}
		case *process.ProcessEvent_Data:
			var w io.Writer
			var b []byte
			switch o := e.Data.GetOutput().(type) {
			case *process.ProcessEvent_DataEvent_Stdout:
				w, b = stdout, o.Stdout
			case *process.ProcessEvent_DataEvent_Stderr:
				w, b = stderr, o.Stderr
			case *process.ProcessEvent_DataEvent_Pty:
				w, b = stdout, o.Pty
			}
			if w != nil && len(b) > 0 {
				if _, err := w.Write(b); err != nil {
					return -1, fmt.Errorf("write output: %w", err)
				}
			}
		case *process.ProcessEvent_End:
			end := e.End
			code := ExitCode(end.GetExitCode(), end.GetExited(), end.GetStatus())
			afterEnd(stream, cancel)
			return code, nil
		}
	}
	if err := stream.Err(); err != nil {
		return -1, agentError(err)
	}
	return -1, fmt.Errorf("process stream ended without an end event: %w", errdefs.ErrUnavailable)
}

// afterEndWait bounds how long afterEnd waits for a stream's own end.
const afterEndWait = time.Second

// afterEnd reads a process stream past its end event to the stream's own
// end, which the agent sends right after it. A response read to its end
// hands its connection back to the transport's pool; one closed early
// (connect's Close does not drain) is torn down, and the next call dials
// again: a TCP handshake to the daemon, and the daemon's own to the agent
// inside the sandbox, on every exec. The far end is a sandbox's agent, so
// the read is bounded: a few messages, and afterEndWait, after which
// cancel cuts the stream as Close would have.
func afterEnd(stream interface{ Receive() bool }, cancel context.CancelFunc) {
	t := time.AfterFunc(afterEndWait, cancel)
	defer t.Stop()
	for i := 0; i < 4 && stream.Receive(); i++ {
	}
}

// forwardStdin copies r to the process's stdin, then closes it. Errors end
// the forwarding quietly: they mean the process is gone, which Exec reports.
func forwardStdin(ctx context.Context, pc interface {
	SendInput(context.Context, *connect.Request[process.SendInputRequest]) (*connect.Response[process.SendInputResponse], error)
	CloseStdin(context.Context, *connect.Request[process.CloseStdinRequest]) (*connect.Response[process.CloseStdinResponse], error)
}, pid uint32, user string, r io.Reader) {
	sel := &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: pid}}
	buf := make([]byte, stdinChunk)
	for {
		n, rerr := r.Read(buf)
		if n > 0 {
			req := connect.NewRequest(&process.SendInputRequest{
				Process: sel,
				Input:   &process.ProcessInput{Input: &process.ProcessInput_Stdin{Stdin: append([]byte(nil), buf[:n]...)}},
			})
			req.Header().Set("Authorization", basicUser(user))
			if _, err := pc.SendInput(ctx, req); err != nil {
				return
			}
		}
		if rerr != nil || ctx.Err() != nil {
			break
		}
	}
	req := connect.NewRequest(&process.CloseStdinRequest{Process: sel})
	req.Header().Set("Authorization", basicUser(user))
	_, _ = pc.CloseStdin(ctx, req)
}

// Start runs a command in the background and returns its pid once it has
// started; its output is not collected (Attach to follow it). req.Stdin and
// the output writers are ignored. Unlike Exec, ctx bounds only the start,
// not the command, which runs on after Start returns (until it exits, is
// signalled, or req.Timeout passes).
func (s *Sandbox) Start(ctx context.Context, req ExecRequest) (uint32, error) {
	pc, err := s.processClient()
	if err != nil {
		return 0, err
	}
	req.Stdin = nil
	sr, err := req.startRequest()
	if err != nil {
		return 0, err
	}
	creq := connect.NewRequest(sr)
	setHeaders(creq.Header(), s.userOr(req.User))
	// The agent turns a request deadline into the process's time limit
	// (Connect-Timeout-Ms, as envd does), so the stream runs under a
	// context without one, cancelled with ctx.
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	stop := context.AfterFunc(ctx, cancel)
	defer stop()
	stream, err := pc.Start(sctx, creq)
	if err != nil {
		return 0, agentError(err)
	}
	// Closing the stream after the start event leaves the process running.
	defer stream.Close()
	for stream.Receive() {
		if st, ok := stream.Msg().GetEvent().GetEvent().(*process.ProcessEvent_Start); ok {
			return st.Start.GetPid(), nil
		}
	}
	if ctx.Err() != nil {
		return 0, ctx.Err()
	}
	if err := stream.Err(); err != nil {
		return 0, agentError(err)
	}
	return 0, fmt.Errorf("process stream ended before the start event: %w", errdefs.ErrUnavailable)
}

// Attach follows a running process's further output until it ends and
// returns its exit code (128+n for signal n).
func (s *Sandbox) Attach(ctx context.Context, pid uint32, stdout, stderr io.Writer) (int, error) {
	pc, err := s.processClient()
	if err != nil {
		return -1, err
	}
	creq := connect.NewRequest(&process.ConnectRequest{
		Process: &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: pid}},
	})
	setHeaders(creq.Header(), s.userOr(""))
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := pc.Connect(ctx, creq)
	if err != nil {
		return -1, agentError(err)
	}
	defer stream.Close()
	return receive(stream, cancel, stdout, stderr, nil)
}

// Processes lists the processes the agent started that are still running.
func (s *Sandbox) Processes(ctx context.Context) ([]ProcessInfo, error) {
	pc, err := s.processClient()
	if err != nil {
		return nil, err
	}
	creq := connect.NewRequest(&process.ListRequest{})
	setHeaders(creq.Header(), s.userOr(""))
	resp, err := pc.List(ctx, creq)
	if err != nil {
		return nil, agentError(err)
	}
	out := make([]ProcessInfo, 0, len(resp.Msg.GetProcesses()))
	for _, p := range resp.Msg.GetProcesses() {
		cfg := p.GetConfig()
		out = append(out, ProcessInfo{
			PID: p.GetPid(), Tag: p.GetTag(),
			Cmd: cfg.GetCmd(), Args: cfg.GetArgs(), Env: cfg.GetEnvs(), Cwd: cfg.GetCwd(),
		})
	}
	return out, nil
}

// Signal sends signal sig (a number, e.g. 15 for SIGTERM) to process pid.
// The envd protocol names only SIGTERM and SIGKILL; other numbers travel as
// open enum values, which an agent may refuse.
func (s *Sandbox) Signal(ctx context.Context, pid uint32, sig int) error {
	pc, err := s.processClient()
	if err != nil {
		return err
	}
	if sig <= 0 || sig >= 128 {
		return fmt.Errorf("signal %d: %w", sig, errdefs.ErrInvalidArgument)
	}
	creq := connect.NewRequest(&process.SendSignalRequest{
		Process: &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: pid}},
		Signal:  process.Signal(sig),
	})
	setHeaders(creq.Header(), s.userOr(""))
	if _, err := pc.SendSignal(ctx, creq); err != nil {
		return agentError(err)
	}
	return nil
}
