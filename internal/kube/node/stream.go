package node

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"

	"github.com/virtual-kubelet/virtual-kubelet/node/api"
	utilexec "k8s.io/utils/exec"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/errdefs"
)

// maxLog bounds what one logs request reads of a container's log file.
const maxLog = 16 << 20

// GetContainerLogs returns what the container's process has printed
// (stdout and stderr, interleaved as written), kept inside the sandbox.
func (p *Pods) GetContainerLogs(ctx context.Context, namespace, podName, container string, opts api.ContainerLogOpts) (io.ReadCloser, error) {
	id, err := p.sandboxOf(namespace, podName, container)
	if err != nil {
		return nil, err
	}
	limit := maxLog
	if opts.LimitBytes > 0 && opts.LimitBytes < limit {
		limit = opts.LimitBytes
	}
	var buf bytes.Buffer
	err = p.sb.ReadFile(ctx, id, podDir+"/"+container+".log", &truncWriter{w: &buf, n: limit})
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
		// Nothing printed yet (or a container without a process).
	case err != nil:
		return nil, fmt.Errorf("read log of %s/%s/%s: %w", namespace, podName, container, err)
	}
	out := buf.Bytes()
	if opts.Tail > 0 {
		out = tail(out, opts.Tail)
	}
	return io.NopCloser(bytes.NewReader(out)), nil
}

// tail keeps the last n lines of b.
func tail(b []byte, n int) []byte {
	end := len(b)
	if end > 0 && b[end-1] == '\n' {
		end--
	}
	for i := end - 1; i >= 0; i-- {
		if b[i] == '\n' {
			n--
			if n == 0 {
				return b[i+1:]
			}
		}
	}
	return b
}

// truncWriter keeps the first n bytes and drops the rest.
type truncWriter struct {
	w io.Writer
	n int
}

func (t *truncWriter) Write(b []byte) (int, error) {
	k := min(len(b), t.n)
	if k > 0 {
		if _, err := t.w.Write(b[:k]); err != nil {
			return 0, err
		}
		t.n -= k
	}
	return len(b), nil
}

// RunInContainer runs cmd in the pod's sandbox through the agent (kubectl
// exec), on a terminal when asked. A non-zero exit is returned as an exit
// error, which the kubelet API reports to the client as the exit code.
func (p *Pods) RunInContainer(ctx context.Context, namespace, podName, container string, cmd []string, attach api.AttachIO) error {
	id, err := p.sandboxOf(namespace, podName, container)
	if err != nil {
		return err
	}
	if len(cmd) == 0 {
		return fmt.Errorf("exec: no command: %w", errdefs.ErrInvalidArgument)
	}
	var code int
	if attach.TTY() {
		code, err = p.execPTY(ctx, id, cmd, attach)
	} else {
		req := client.ExecRequest{Cmd: cmd[0], Args: cmd[1:]}
		if in := attach.Stdin(); in != nil {
			req.Stdin = in
		}
		if out := attach.Stdout(); out != nil {
			req.Stdout = out
		}
		if e := attach.Stderr(); e != nil {
			req.Stderr = e
		}
		code, err = p.sb.Exec(ctx, id, req)
	}
	if err != nil {
		return err
	}
	if code != 0 {
		return utilexec.CodeExitError{Err: fmt.Errorf("command %q exited with %d", strings.Join(cmd, " "), code), Code: code}
	}
	return nil
}

func (p *Pods) execPTY(ctx context.Context, id string, cmd []string, attach api.AttachIO) (int, error) {
	req := client.PTYRequest{Cmd: cmd[0], Args: cmd[1:], Cols: 80, Rows: 24}
	pty, err := p.sb.ExecPTY(ctx, id, req)
	if err != nil {
		return -1, err
	}
	defer pty.Close()
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if rs := attach.Resize(); rs != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-ctx.Done():
					return
				case s, ok := <-rs:
					if !ok {
						return
					}
					_ = pty.Resize(s.Width, s.Height)
				}
			}
		}()
	}
	if in := attach.Stdin(); in != nil {
		// Not waited for: a read on the client's stdin ends only when the
		// client closes it; the stream's end closes it for us.
		go func() { _, _ = io.Copy(pty, in) }()
	}
	if out := attach.Stdout(); out != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = io.Copy(out, pty)
		}()
	}
	code, err := pty.Wait()
	cancel()
	return code, err
}

// AttachToContainer is not offered: a container's own stdin is not kept
// open (use exec).
func (p *Pods) AttachToContainer(context.Context, string, string, string, api.AttachIO) error {
	return fmt.Errorf("attach is not supported on Berth nodes; use exec: %w", errdefs.ErrFailedPrecondition)
}

// PortForward is not offered yet.
func (p *Pods) PortForward(context.Context, string, string, int32, io.ReadWriteCloser) error {
	return fmt.Errorf("port-forward is not supported on Berth nodes yet: %w", errdefs.ErrFailedPrecondition)
}
