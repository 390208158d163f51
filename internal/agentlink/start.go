package agentlink

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"connectrpc.com/connect"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/proto/process"
	"github.com/berth-sandbox/berth/proto/process/processconnect"
)

// Background is a process started with Start: it keeps running in the
// sandbox after Close, which only stops watching it.
type Background struct {
	Pid    uint32
	cancel context.CancelFunc
	done   chan struct{}

	mu     sync.Mutex
	tail   []byte
	res    Result
	ended  bool
	stream *connect.ServerStreamForClient[process.StartResponse]
}

// maxTail is how much of a background process's latest output is kept for
// an error message.
const maxTail = 2 << 10

// Start starts c in the sandbox and returns once the agent reports it
// started. Unlike Run, the process does not die with ctx or the stream:
// it runs until it exits or the sandbox ends. Until Close, the Background
// watches it (Ended, Tail). c.Stdout, c.Stderr and c.Timeout are ignored.
func (l *Link) Start(ctx context.Context, addr, token string, c Command) (*Background, error) {
	if len(c.Argv) == 0 {
		return nil, fmt.Errorf("start: empty command: %w", errdefs.ErrInvalidArgument)
	}
	pc := processconnect.NewProcessClient(&http.Client{Transport: l.transport}, "http://"+addr, connect.WithReadMaxBytes(MaxAgentMessage))
	stdin, kill := false, false
	cfg := &process.ProcessConfig{Cmd: c.Argv[0], Args: c.Argv[1:], Envs: c.Env}
	if c.Cwd != "" {
		cfg.Cwd = &c.Cwd
	}
	req := connect.NewRequest(&process.StartRequest{Process: cfg, Stdin: &stdin, KillOnDisconnect: &kill})
	req.Header().Set("X-Access-Token", token)
	if c.User != "" {
		req.Header().Set("Authorization", basicUser(c.User))
	}
	// The stream must carry no deadline: the agent would kill the
	// process when it passed (Connect-Timeout-Ms). The watch ends with
	// Close or with ctx.
	sctx, cancelStream := context.WithCancel(context.WithoutCancel(ctx))
	stopAfter := context.AfterFunc(ctx, cancelStream)
	cancel := func() {
		stopAfter()
		cancelStream()
	}
	stream, err := pc.Start(sctx, req)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("start %s: %v: %w", c.Argv[0], err, errdefs.ErrUnavailable)
	}
	if !stream.Receive() {
		err := stream.Err()
		stream.Close()
		cancel()
		if err == nil {
			err = errors.New("stream ended before the start event")
		}
		return nil, fmt.Errorf("start %s: %v: %w", c.Argv[0], err, errdefs.ErrUnavailable)
	}
	st, ok := stream.Msg().GetEvent().GetEvent().(*process.ProcessEvent_Start)
	if !ok {
		stream.Close()
		cancel()
		return nil, fmt.Errorf("start %s: the agent's first event is not a start: %w", c.Argv[0], errdefs.ErrUnavailable)
	}
	b := &Background{Pid: st.Start.GetPid(), cancel: cancel, done: make(chan struct{}), stream: stream}
	go b.watch()
	return b, nil
}

func (b *Background) watch() {
	defer close(b.done)
	for b.stream.Receive() {
		switch e := b.stream.Msg().GetEvent().GetEvent().(type) {
		case *process.ProcessEvent_Data:
			var out []byte
			switch o := e.Data.GetOutput().(type) {
			case *process.ProcessEvent_DataEvent_Stdout:
				out = o.Stdout
			case *process.ProcessEvent_DataEvent_Stderr:
				out = o.Stderr
			case *process.ProcessEvent_DataEvent_Pty:
				out = o.Pty
			}
			b.mu.Lock()
			b.tail = append(b.tail, out...)
			if len(b.tail) > maxTail {
				b.tail = append([]byte(nil), b.tail[len(b.tail)-maxTail:]...)
			}
			b.mu.Unlock()
		case *process.ProcessEvent_End:
			end := e.End
			b.mu.Lock()
			b.res = Result{Exited: end.GetExited(), ExitCode: int(end.GetExitCode()), Status: end.GetStatus()}
			if !b.res.Exited && b.res.ExitCode < 0 {
				b.res.ExitCode = 255
			}
			b.ended = true
			b.mu.Unlock()
			return
		}
	}
}

// Ended is closed when the process ended or the watch stopped (Close, a
// lost stream); Result says which.
func (b *Background) Ended() <-chan struct{} { return b.done }

// Result reports how the process ended; ok is false while it runs or
// when the watch stopped without an end event.
func (b *Background) Result() (res Result, ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.res, b.ended
}

// Tail is the process's latest output (at most 2 KiB), as the watch saw it.
func (b *Background) Tail() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.tail)
}

// Close stops watching; the process keeps running.
func (b *Background) Close() {
	b.cancel()
	<-b.done
	b.stream.Close()
}

// maxProcNet bounds /proc/net/tcp{,6} read back from a sandbox (the agent
// is not trusted; a busy sandbox has a few hundred lines of 150 bytes).
const maxProcNet = 8 << 20

// Listening reports whether something in the sandbox listens on TCP port
// port, from the sandbox's own /proc/net/tcp and tcp6 (no tools needed in
// the sandbox).
func (l *Link) Listening(ctx context.Context, addr, token string, port int) (bool, error) {
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := l.ReadFile(ctx, addr, token, f, maxProcNet)
		if errors.Is(err, errdefs.ErrNotFound) {
			continue // no IPv6 in the sandbox
		}
		if err != nil {
			return false, err
		}
		if ListensOn(b, port) {
			return true, nil
		}
	}
	return false, nil
}

// ListensOn reports whether a /proc/net/tcp (or tcp6) table has a socket in state
// LISTEN (0A) on port.
func ListensOn(table []byte, port int) bool {
	sc := bufio.NewScanner(bytes.NewReader(table))
	sc.Buffer(make([]byte, 4096), 4096)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 || f[3] != "0A" {
			continue
		}
		_, hexPort, ok := strings.Cut(f[1], ":")
		if !ok {
			continue
		}
		if p, err := strconv.ParseUint(hexPort, 16, 16); err == nil && int(p) == port {
			return true
		}
	}
	return false
}

// Exists reports whether path exists in the sandbox (as root sees it).
func (l *Link) Exists(ctx context.Context, addr, token, path string) (bool, error) {
	_, err := l.ReadFile(ctx, addr, token, path, 0)
	switch {
	case err == nil, errors.Is(err, errdefs.ErrResourceExhausted):
		return true, nil
	case errors.Is(err, errdefs.ErrNotFound):
		return false, nil
	}
	return false, err
}
