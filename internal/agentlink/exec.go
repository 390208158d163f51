package agentlink

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"connectrpc.com/connect"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/proto/process"
	"github.com/berth-sandbox/berth/proto/process/processconnect"
)

func basicUser(user string) string {
	if user == "" {
		user = "root"
	}
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"))
}

// maxAgentMessage bounds one message read from an agent's stream.
const maxAgentMessage = 1 << 20

// Exec runs argv in the sandbox whose agent is at addr, as user (default
// root) in cwd with env added, streams stdout and stderr to out (nil
// discards) and returns the exit code. The command dies with ctx: the
// agent kills its process group when ctx's deadline passes or ctx is
// cancelled. The host uses it for workspace clone and setup steps;
// no shell is involved unless argv[0] is one.
func (l *Link) Exec(ctx context.Context, addr, token, user, cwd string, argv []string, env map[string]string, out io.Writer) (int, error) {
	if len(argv) == 0 {
		return -1, fmt.Errorf("exec: empty command: %w", errdefs.ErrInvalidArgument)
	}
	c := struct {
		Cmd, Cwd, User string
		Args           []string
		Env            map[string]string
		Output         io.Writer
	}{argv[0], cwd, user, argv[1:], env, out}
	// The agent sends output in 32 KiB chunks; a larger message is an
	// agent the sandbox subverted, refused before it is buffered.
	pc := processconnect.NewProcessClient(&http.Client{Transport: l.transport}, "http://"+addr, connect.WithReadMaxBytes(maxAgentMessage))
	stdin := false
	cfg := &process.ProcessConfig{Cmd: c.Cmd, Args: c.Args, Envs: c.Env}
	if c.Cwd != "" {
		cfg.Cwd = &c.Cwd
	}
	kill := true
	req := connect.NewRequest(&process.StartRequest{Process: cfg, Stdin: &stdin, KillOnDisconnect: &kill})
	req.Header().Set("X-Access-Token", token)
	req.Header().Set("Authorization", basicUser(c.User))
	req.Header().Set("Keepalive-Ping-Interval", "30")
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := pc.Start(ctx, req)
	if err != nil {
		return -1, fmt.Errorf("start %s: %w", c.Cmd, err)
	}
	defer stream.Close()
	out = c.Output
	if out == nil {
		out = io.Discard
	}
	for stream.Receive() {
		switch e := stream.Msg().GetEvent().GetEvent().(type) {
		case *process.ProcessEvent_Data:
			var b []byte
			switch o := e.Data.GetOutput().(type) {
			case *process.ProcessEvent_DataEvent_Stdout:
				b = o.Stdout
			case *process.ProcessEvent_DataEvent_Stderr:
				b = o.Stderr
			case *process.ProcessEvent_DataEvent_Pty:
				b = o.Pty
			}
			if len(b) > 0 {
				if _, err := out.Write(b); err != nil {
					return -1, fmt.Errorf("%s: write output: %w", c.Cmd, err)
				}
			}
		case *process.ProcessEvent_End:
			end := e.End
			if end.GetExited() || end.GetExitCode() >= 0 {
				return int(end.GetExitCode()), nil
			}
			return 255, nil
		}
	}
	if err := stream.Err(); err != nil {
		return -1, fmt.Errorf("%s: %w", c.Cmd, err)
	}
	return -1, fmt.Errorf("%s: process stream ended without an end event: %w", c.Cmd, errdefs.ErrUnavailable)
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
