package agentlink

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	"connectrpc.com/connect"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/proto/process"
	"github.com/berth-sandbox/berth/proto/process/processconnect"
)

func basicUser(user string) string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"))
}

// MaxAgentMessage bounds one message read from an agent's process stream:
// the agent sends output in 32 KiB chunks, so a larger message is an agent
// the sandbox subverted, refused before it is buffered.
const MaxAgentMessage = 1 << 20

// Command is one command the host runs in a sandbox through its agent. No
// shell is involved unless Argv[0] is one.
type Command struct {
	Argv []string
	// Env is added to the agent's base environment.
	Env map[string]string
	// User runs the command ("" = the sandbox's default user).
	User string
	// Cwd is the working directory ("" = the user's home).
	Cwd string
	// Stdout and Stderr receive the output as it arrives (nil discards;
	// they may be the same writer). A failed write ends the command: the
	// writer is where the caller bounds what a sandbox may send.
	Stdout, Stderr io.Writer
	// Timeout, when set, bounds the command on top of ctx.
	Timeout time.Duration
}

// Result is how a command ended.
type Result struct {
	// Exited is false when the process did not exit on its own (a signal).
	Exited bool
	// ExitCode is the exit code; 255 for a process ended by a signal the
	// agent reported no code for.
	ExitCode int
	// Status is the agent's description of the end ("exit status 1").
	Status string
}

// Run runs c in the sandbox whose agent is at addr, through rt (the
// daemon's agent transport, or the work log's so the command is recorded),
// and returns how it ended. The command dies with ctx: the agent kills its
// process group when ctx's deadline passes, ctx is cancelled, or Run
// returns early because a writer failed. Errors reaching the agent or
// reading its stream are classified errdefs.ErrUnavailable; a writer's
// error is wrapped as it is.
func Run(ctx context.Context, rt http.RoundTripper, addr, token string, c Command) (Result, error) {
	if len(c.Argv) == 0 {
		return Result{}, fmt.Errorf("exec: empty command: %w", errdefs.ErrInvalidArgument)
	}
	if c.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.Timeout)
		defer cancel()
	}
	name := c.Argv[0]
	pc := processconnect.NewProcessClient(&http.Client{Transport: rt}, "http://"+addr, connect.WithReadMaxBytes(MaxAgentMessage))
	stdin := false
	cfg := &process.ProcessConfig{Cmd: name, Args: c.Argv[1:], Envs: c.Env}
	if c.Cwd != "" {
		cfg.Cwd = &c.Cwd
	}
	kill := true
	req := connect.NewRequest(&process.StartRequest{Process: cfg, Stdin: &stdin, KillOnDisconnect: &kill})
	req.Header().Set("X-Access-Token", token)
	if c.User != "" {
		req.Header().Set("Authorization", basicUser(c.User))
	}
	req.Header().Set("Keepalive-Ping-Interval", "30")
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := pc.Start(ctx, req)
	if err != nil {
		return Result{}, fmt.Errorf("start %s: %v: %w", name, err, errdefs.ErrUnavailable)
	}
	defer stream.Close()
	stdout, stderr := c.Stdout, c.Stderr
	if stdout == nil {
		stdout = io.Discard
	}
	if stderr == nil {
		stderr = io.Discard
	}
	for stream.Receive() {
		switch e := stream.Msg().GetEvent().GetEvent().(type) {
		case *process.ProcessEvent_Data:
			var b []byte
			w := stdout
			switch o := e.Data.GetOutput().(type) {
			case *process.ProcessEvent_DataEvent_Stdout:
				b = o.Stdout
			case *process.ProcessEvent_DataEvent_Stderr:
				b, w = o.Stderr, stderr
			case *process.ProcessEvent_DataEvent_Pty:
				b = o.Pty
			}
			if len(b) > 0 {
				// A failed write (the caller's bound, a client gone) ends
				// the run at once rather than draining the sandbox's output.
				if _, err := w.Write(b); err != nil {
					return Result{}, fmt.Errorf("%s: write output: %w", name, err)
				}
			}
		case *process.ProcessEvent_End:
			end := e.End
			res := Result{Exited: end.GetExited(), ExitCode: int(end.GetExitCode()), Status: end.GetStatus()}
			if !res.Exited && res.ExitCode < 0 {
				res.ExitCode = 255
			}
			return res, nil
		}
	}
	if err := stream.Err(); err != nil {
		return Result{}, fmt.Errorf("%s: %v: %w", name, err, errdefs.ErrUnavailable)
	}
	return Result{}, fmt.Errorf("%s: process stream ended without an end event: %w", name, errdefs.ErrUnavailable)
}

// Run runs c through the Link's agent transport (see the function Run).
func (l *Link) Run(ctx context.Context, addr, token string, c Command) (Result, error) {
	return Run(ctx, l.transport, addr, token, c)
}

// WriteFile stores r at path in the sandbox as root, creating parents.
func (l *Link) WriteFile(ctx context.Context, addr, token, path string, r io.Reader) error {
	u := "http://" + addr + "/files?username=root&path=" + url.QueryEscape(path)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, r)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	req.Header.Set("X-Access-Token", token)
	resp, err := (&http.Client{Transport: l.transport}).Do(req)
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("write %s: agent answered %s: %s", path, resp.Status, msg)
	}
	return nil
}

// ReadFile returns the file at path in the sandbox, read as root. A file
// the agent does not find is ErrNotFound; one longer than max bytes is
// ErrResourceExhausted (never a silently cut copy).
func (l *Link) ReadFile(ctx context.Context, addr, token, path string, max int64) ([]byte, error) {
	u := "http://" + addr + "/files?username=root&path=" + url.QueryEscape(path)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("X-Access-Token", token)
	resp, err := (&http.Client{Transport: l.transport}).Do(req)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		return nil, fmt.Errorf("read %s: %w", path, errdefs.ErrNotFound)
	}
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return nil, fmt.Errorf("read %s: agent answered %s: %s", path, resp.Status, msg)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, max+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("read %s: longer than %d bytes: %w", path, max, errdefs.ErrResourceExhausted)
	}
	return b, nil
}
