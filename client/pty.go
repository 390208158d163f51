package client

import (
	"context"
	"fmt"
	"io"
	"sync"

	"connectrpc.com/connect"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/proto/process"
	"github.com/berth-sandbox/berth/proto/process/processconnect"
)

// PTYRequest describes an interactive process on a pseudo-terminal.
type PTYRequest struct {
	Cmd  string
	Args []string
	Env  map[string]string
	Cwd  string
	User string
	Cols uint16
	Rows uint16
}

// PTY is a process running on a pseudo-terminal in a sandbox. Read returns
// the terminal's output, Write types into it. Close (or Kill) when done.
type PTY struct {
	pc   processconnect.ProcessClient
	user string
	pid  uint32
	// ctx is the stream's context. It is kept because io.Reader/io.Writer
	// methods take none, and input must stop when the PTY is closed.
	ctx    context.Context
	cancel context.CancelFunc

	out  *io.PipeReader
	done chan struct{} // closed when the reader goroutine returns
	code int
	err  error

	closeOnce sync.Once
}

// StartPTY starts an interactive process on a terminal of cols×rows. The
// process runs until it exits, Kill is called, or its client goes away: when
// ctx ends, Close is called or the connection drops, the agent kills the
// process's group, as a terminal's hangup would.
func (s *Sandbox) StartPTY(ctx context.Context, req PTYRequest) (*PTY, error) {
	pc, err := s.processClient()
	if err != nil {
		return nil, err
	}
	if req.Cmd == "" {
		return nil, fmt.Errorf("pty: command is empty: %w", errdefs.ErrInvalidArgument)
	}
	if req.Cols == 0 || req.Rows == 0 {
		req.Cols, req.Rows = 80, 24
	}
	sr := &process.StartRequest{
		Process: &process.ProcessConfig{Cmd: req.Cmd, Args: req.Args, Envs: req.Env},
		Pty:     &process.PTY{Size: &process.PTY_Size{Cols: uint32(req.Cols), Rows: uint32(req.Rows)}},
	}
	kill := true
	sr.KillOnDisconnect = &kill
	if req.Cwd != "" {
		sr.Process.Cwd = &req.Cwd
	}
	user := s.userOr(req.User)
	creq := connect.NewRequest(sr)
	setHeaders(creq.Header(), user)

	// No deadline for the stream: the agent would make it the shell's
	// time limit. Cancellation of ctx still ends it.
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, cancel)
	stream, err := pc.Start(sctx, creq)
	if err != nil {
		stop()
		cancel()
		return nil, agentError(err)
	}
	var pid uint32
	for pid == 0 && stream.Receive() {
		if st, ok := stream.Msg().GetEvent().GetEvent().(*process.ProcessEvent_Start); ok {
			pid = st.Start.GetPid()
		}
	}
	if pid == 0 {
		err := stream.Err()
		_ = stream.Close()
		stop()
		cancel()
		if err == nil {
			err = fmt.Errorf("pty stream ended before the start event: %w", errdefs.ErrUnavailable)
		}
		return nil, agentError(err)
	}
	pr, pw := io.Pipe()
	p := &PTY{pc: pc, user: user, pid: pid, ctx: sctx, cancel: cancel, out: pr, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		defer stop()
		defer stream.Close()
		code, err := receive(stream, cancel, pw, pw, nil)
		p.code, p.err = code, err
		if err == nil {
			err = io.EOF
		}
		_ = pw.CloseWithError(err)
	}()
	return p, nil
}

// PID is the process id inside the sandbox.
func (p *PTY) PID() uint32 { return p.pid }

// Read reads terminal output. It returns io.EOF after the process ended
// and all output was read.
func (p *PTY) Read(b []byte) (int, error) { return p.out.Read(b) }

// Write types b into the terminal. Control characters (Ctrl-C is 0x03)
// reach the process as a terminal would deliver them.
func (p *PTY) Write(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	req := connect.NewRequest(&process.SendInputRequest{
		Process: p.selector(),
		Input:   &process.ProcessInput{Input: &process.ProcessInput_Pty{Pty: append([]byte(nil), b...)}},
	})
	req.Header().Set("Authorization", basicUser(p.user))
	if _, err := p.pc.SendInput(p.ctx, req); err != nil {
		return 0, agentError(err)
	}
	return len(b), nil
}

// Resize changes the terminal size (the process gets SIGWINCH).
func (p *PTY) Resize(cols, rows uint16) error {
	req := connect.NewRequest(&process.UpdateRequest{
		Process: p.selector(),
		Pty:     &process.PTY{Size: &process.PTY_Size{Cols: uint32(cols), Rows: uint32(rows)}},
	})
	req.Header().Set("Authorization", basicUser(p.user))
	if _, err := p.pc.Update(p.ctx, req); err != nil {
		return agentError(err)
	}
	return nil
}

// Wait waits for the process to end and returns its exit code (128+n for
// signal n). Output must be drained with Read meanwhile: the process's
// output is not buffered without bound.
func (p *PTY) Wait() (int, error) {
	<-p.done
	return p.code, p.err
}

// Kill sends SIGKILL to the process. Wait then returns 137.
func (p *PTY) Kill() error {
	req := connect.NewRequest(&process.SendSignalRequest{Process: p.selector(), Signal: process.Signal_SIGNAL_SIGKILL})
	req.Header().Set("Authorization", basicUser(p.user))
	if _, err := p.pc.SendSignal(p.ctx, req); err != nil {
		return agentError(err)
	}
	return nil
}

// Close stops following the process and waits for the reader goroutine.
// A process still running then is killed by the agent (its client left).
func (p *PTY) Close() error {
	p.closeOnce.Do(func() {
		// Closing the read side first unblocks a goroutine stuck writing
		// output nobody reads.
		_ = p.out.Close()
		p.cancel()
		<-p.done
	})
	return nil
}

func (p *PTY) selector() *process.ProcessSelector {
	return &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: p.pid}}
}
