package node

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
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
		wg.Go(func() {
			forwardResizes(ctx, rs, func(s api.TermSize) { _ = pty.Resize(s.Width, s.Height) })
		})
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
// now on, stdout and stderr apart (one stream on a terminal), until it
// exits or the client goes. With -i the client's input goes to the
// container's stdin, and with -t its terminal's size to the container's
// terminal, through `berth-agent podlog-input` run in the sandbox, which
// writes into the container's FIFOs (berth-agent podlog). A container
// made without stdin (or a terminal) refuses -i (or -t), as a kubelet's
// does; one with stdinOnce takes the first attach's input only.
func (p *Pods) AttachToContainer(ctx context.Context, namespace, podName, container string, attach api.AttachIO) error {
	c, ok := p.containerPlan(namespace, podName, container)
	switch {
	case ok && attach.Stdin() != nil && !c.stdin:
		return fmt.Errorf("container %s was not made with stdin: true; attach without -i, or use exec: %w", container, errdefs.ErrFailedPrecondition)
	case ok && attach.TTY() && !c.tty:
		return fmt.Errorf("container %s was not made with tty: true; attach without -t, or use exec -t: %w", container, errdefs.ErrFailedPrecondition)
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
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	if in := attach.Stdin(); in != nil {
		// Not waited for: a read of the client's stdin ends only when the
		// client closes it; the stream's end, after this returns, does.
		go p.podInput(ctx, id, []string{"-fifo", stdinPath(container)}, in)
	}
	if rs := attach.Resize(); rs != nil && attach.TTY() {
		wg.Go(func() {
			forwardResizes(ctx, rs, func(sz api.TermSize) {
				p.podInput(ctx, id, []string{"-fifo", resizePath(container),
					"-cols", strconv.Itoa(int(sz.Width)), "-rows", strconv.Itoa(int(sz.Height))}, nil)
			})
		})
	}
	err = s.run(ctx, f, 0, out)
	if ctx.Err() != nil {
		return nil // the client went, or the node stops
	}
	return err
}

// forwardResizes calls fn with each terminal size the client sends on rs,
// until rs closes or ctx ends.
func forwardResizes(ctx context.Context, rs <-chan api.TermSize, fn func(api.TermSize)) {
	for {
		select {
		case <-ctx.Done():
			return
		case sz, ok := <-rs:
			if !ok {
				return
			}
			fn(sz)
		}
	}
}

// podInput runs `berth-agent podlog-input args` in sandbox id with in as
// its stdin, as the sandbox's root; a failure (the container not reading:
// it ended, or its once stdin was taken) is logged.
func (p *Pods) podInput(ctx context.Context, id string, args []string, in io.Reader) {
	var stderr strings.Builder
	req := client.ExecRequest{Cmd: agentPath, Args: append([]string{"podlog-input"}, args...), User: "root", Stderr: &limitWriter{w: &stderr, n: 4096}}
	if in != nil {
		req.Stdin = in
	}
	code, err := p.sb.Exec(ctx, id, req)
	if err == nil && code != 0 {
		err = fmt.Errorf("exit %d: %s", code, strings.TrimSpace(stderr.String()))
	}
	if err != nil && ctx.Err() == nil {
		p.log.Info("attach_input_failed", "sandbox_id", id, "args", args, "err", err)
	}
}

// containerPlan is the plan of the pod's container (or init container)
// name.
func (p *Pods) containerPlan(namespace, podName, name string) (containerPlan, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	ps, ok := p.pods[key(namespace, podName)]
	if !ok {
		return containerPlan{}, false
	}
	for _, c := range append(slices.Clone(ps.plan.inits), ps.plan.containers...) {
		if c.name == name {
			return c, true
		}
	}
	return containerPlan{}, false
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
