package node

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/virtual-kubelet/virtual-kubelet/node/api"
	utilexec "k8s.io/utils/exec"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/splice"
)

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

// AttachToContainer serves kubectl attach: what the container prints from
// now on, stdout and stderr apart, until it exits or the client goes.
// A container has no stdin or terminal of its own on a Berth node (a pod
// asking for one is refused), so attaching with -i or -t is refused: use
// exec.
func (p *Pods) AttachToContainer(ctx context.Context, namespace, podName, container string, attach api.AttachIO) error {
	if attach.Stdin() != nil || attach.TTY() {
		return fmt.Errorf("attach with stdin or a terminal is not supported on Berth nodes (a container has none of its own); use exec -it: %w", errdefs.ErrFailedPrecondition)
	}
	id, _, err := p.logTarget(namespace, podName, container)
	if err != nil {
		return err
	}
	s := &logStream{files: p.sb, id: id, log: logPath(container), exit: exitPath(container), follow: true}
	if st, err := p.sb.Stat(ctx, id, s.log); err == nil {
		s.start = st.Size
	}
	f := newLogFilter(api.ContainerLogOpts{}, time.Now())
	f.stderr = io.Discard
	if e := attach.Stderr(); e != nil {
		f.stderr = e
	}
	var out io.Writer = io.Discard
	if o := attach.Stdout(); o != nil {
		out = o
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(p.ctx, cancel)()
	err = s.run(ctx, f, 0, out)
	if ctx.Err() != nil {
		return nil // the client went, or the node stops
	}
	return err
}

// PortForward carries one connection of kubectl port-forward (the
// kubelet API's stream for it) to port in the pod's sandbox, through the
// daemon's port tunnel: bytes both ways until both sides end. Nothing
// listening on the port fails this connection only, as on a kubelet.
func (p *Pods) PortForward(ctx context.Context, namespace, podName string, port int32, stream io.ReadWriteCloser) error {
	defer stream.Close()
	id, err := p.podSandbox(namespace, podName)
	if err != nil {
		return err
	}
	if port < 1 || port > 65535 {
		return fmt.Errorf("port %d: want 1 to 65535: %w", port, errdefs.ErrInvalidArgument)
	}
	remote, err := p.sb.DialPort(ctx, id, int(port))
	if err != nil {
		return fmt.Errorf("port-forward to pod %s/%s port %d: %w", namespace, podName, port, err)
	}
	defer remote.Close()
	stop := context.AfterFunc(ctx, func() {
		stream.Close()
		remote.Close()
	})
	defer stop()
	splice.Conns(stream, remote)
	return nil
}
