package agent

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"os"
	"slices"
	"strconv"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	pb "github.com/berth-sandbox/berth/proto/process"
	"github.com/berth-sandbox/berth/proto/process/processconnect"
)

var connectErrorWriter = connect.NewErrorWriter()

func connectUnauthenticated(err error) *connect.Error {
	return connect.NewError(connect.CodeUnauthenticated, err)
}

// processService implements process.Process.
type processService struct {
	processconnect.UnimplementedProcessHandler
	s *Server
}

func (ps *processService) List(_ context.Context, _ *connect.Request[pb.ListRequest]) (*connect.Response[pb.ListResponse], error) {
	res := &pb.ListResponse{}
	for _, p := range ps.s.procs.list() {
		res.Processes = append(res.Processes, &pb.ProcessInfo{Config: p.config, Pid: uint32(p.pid), Tag: p.tag})
	}
	slices.SortFunc(res.Processes, func(a, b *pb.ProcessInfo) int { return int(a.Pid) - int(b.Pid) })
	return connect.NewResponse(res), nil
}

// keepaliveInterval honours the SDK's Keepalive-Ping-Interval header (seconds).
func (s *Server) keepaliveInterval(h http.Header) time.Duration {
	if v, err := strconv.Atoi(h.Get("Keepalive-Ping-Interval")); err == nil && v > 0 {
		return time.Duration(v) * time.Second
	}
	return s.cfg.KeepaliveInterval
}

func (ps *processService) Start(ctx context.Context, req *connect.Request[pb.StartRequest], stream *connect.ServerStream[pb.StartResponse]) error {
	s := ps.s
	u, err := s.userFor("", req.Header().Get("Authorization"))
	if err != nil {
		return rpcErr(err)
	}
	cfg := req.Msg.GetProcess()
	if cfg.GetCmd() == "" {
		return connect.NewError(connect.CodeInvalidArgument, errors.New("process.cmd is required"))
	}
	dir := u.Home
	if s.cfg.DefaultCwd != "" {
		dir = s.cfg.DefaultCwd
	}
	if cfg.Cwd != nil && cfg.GetCwd() != "" {
		if dir, err = resolvePath(cfg.GetCwd(), u.Home); err != nil {
			return rpcErr(err)
		}
	}
	if fi, err := os.Stat(dir); err != nil {
		return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("cwd %q does not exist", dir))
	} else if !fi.IsDir() {
		return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("cwd %q is not a directory", dir))
	}
	spec := startSpec{
		argv:  append([]string{cfg.GetCmd()}, cfg.GetArgs()...),
		env:   s.processEnv(u, cfg.GetEnvs()),
		dir:   dir,
		user:  u,
		pty:   req.Msg.Pty,
		stdin: req.Msg.Stdin == nil || req.Msg.GetStdin(),
	}
	if spec.limit, spec.limitCode, err = timeLimit(req.Header(), req.Msg); err != nil {
		return rpcErr(err)
	}
	killOnClose := req.Msg.GetKillOnDisconnect()
	if killOnClose && ctx.Err() != nil {
		// The client is already gone: nobody wants this command.
		return ctx.Err()
	}
	// startProc subscribes this stream before any output can be published.
	p, ch, err := s.procs.startProc(spec, req.Msg)
	if err != nil {
		return rpcErr(err)
	}
	defer p.unsubscribe(ch)
	s.log.Info("process_start", "pid", p.pid, "cmd", cfg.GetCmd(), "user", u.Name, "dir", dir)
	err = stream.Send(&pb.StartResponse{Event: &pb.ProcessEvent{Event: &pb.ProcessEvent_Start{Start: &pb.ProcessEvent_StartEvent{Pid: uint32(p.pid)}}}})
	if err == nil {
		// Without timeout_ms the limit is this stream's own deadline.
		ownDeadline := spec.limit > 0 && !spec.limitCode
		err = pump(ctx, p, ch, s.keepaliveInterval(req.Header()), ownDeadline, func(ev *pb.ProcessEvent) error {
			return stream.Send(&pb.StartResponse{Event: ev})
		})
	}
	// The stream ended. Unless that was the end event's delivery, the client
	// went away; a foreground command dies with its client.
	if killOnClose && p.ended() == nil {
		s.log.Info("process_client_gone", "pid", p.pid)
		_ = p.signal(unix.SIGKILL)
	}
	return err
}

// timeLimit is the process's time limit from a Start request: timeout_ms
// (ending with exit code 124) or the Connect deadline the client sent
// (Connect-Timeout-Ms; envd kills the process when it passes and reports
// the signal), whichever is shorter. 0 means none.
func timeLimit(h http.Header, msg *pb.StartRequest) (limit time.Duration, code bool, err error) {
	if v := h.Get("Connect-Timeout-Ms"); v != "" {
		ms, perr := strconv.ParseInt(v, 10, 64)
		if perr != nil || ms < 0 {
			return 0, false, fmt.Errorf("Connect-Timeout-Ms %q: want milliseconds: %w", v, errInvalid)
		}
		limit = time.Duration(ms) * time.Millisecond
	}
	if ms := msg.GetTimeoutMs(); ms > 0 {
		if d := time.Duration(ms) * time.Millisecond; limit == 0 || d <= limit {
			return d, true, nil
		}
	}
	return limit, false, nil
}

func (ps *processService) Connect(ctx context.Context, req *connect.Request[pb.ConnectRequest], stream *connect.ServerStream[pb.ConnectResponse]) error {
	p, err := ps.s.procs.find(req.Msg.GetProcess())
	if err != nil {
		return rpcErr(err)
	}
	ch := p.subscribe()
	defer p.unsubscribe(ch)
	if err := stream.Send(&pb.ConnectResponse{Event: &pb.ProcessEvent{Event: &pb.ProcessEvent_Start{Start: &pb.ProcessEvent_StartEvent{Pid: uint32(p.pid)}}}}); err != nil {
		return err
	}
	return pump(ctx, p, ch, ps.s.keepaliveInterval(req.Header()), false, func(ev *pb.ProcessEvent) error {
		return stream.Send(&pb.ConnectResponse{Event: ev})
	})
}

// pump forwards a process's events to one stream until the end event.
// When the request's context ends first, the stream ends with an error
// saying why (deadline_exceeded for a passed Connect-Timeout-Ms), never
// cleanly: a clean end without the end event reads to the client as a
// process that vanished without a result. ownDeadline says the
// process's time limit is this stream's Connect deadline: a kill at that
// limit then ends the stream as the deadline does, whichever of the two
// timers (the limit's, the context's) ran first.
func pump(ctx context.Context, p *proc, ch chan *pb.ProcessEvent, keepalive time.Duration, ownDeadline bool, send func(*pb.ProcessEvent) error) error {
	tick := time.NewTicker(keepalive)
	defer tick.Stop()
	keep := &pb.ProcessEvent{Event: &pb.ProcessEvent_Keepalive{Keepalive: &pb.ProcessEvent_KeepAlive{}}}
	for {
		select {
		case <-ctx.Done():
			return streamEnded(ctx)
		case ev := <-ch:
			if err := send(ev); err != nil {
				return err
			}
		case <-tick.C:
			if err := send(keep); err != nil {
				return err
			}
		case <-p.endedCh:
			if ctx.Err() != nil {
				// Both ready at once: the deadline passed first (the
				// process limit it set starts later), so it is the answer.
				return streamEnded(ctx)
			}
			if ownDeadline && p.expired() {
				// The limit's timer ran before the context's (each
				// runs on a goroutine of its own): the same deadline.
				return errDeadlinePassed()
			}
			for {
				select {
				case ev := <-ch:
					if err := send(ev); err != nil {
						return err
					}
					continue
				default:
				}
				break
			}
			return send(p.ended())
		}
	}
}

// streamEnded is the error a stream ends with when its request's context
// ended before the process did.
func streamEnded(ctx context.Context) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return errDeadlinePassed()
	}
	return connect.NewError(connect.CodeCanceled, ctx.Err())
}

func errDeadlinePassed() error {
	return connect.NewError(connect.CodeDeadlineExceeded, errors.New("the request's deadline (Connect-Timeout-Ms) passed before the process ended"))
}

// processEnv builds a process's environment: PATH, HOME, USER, LOGNAME,
// SHELL first, then the sandbox-wide environment, then the request's
// variables; later entries win.
func (s *Server) processEnv(u *user, extra map[string]string) []string {
	path := defaultPath
	for _, kv := range s.environ() {
		if len(kv) > 5 && kv[:5] == "PATH=" {
			path = kv[5:]
		}
	}
	env := []string{"PATH=" + path, "HOME=" + u.Home, "USER=" + u.Name, "LOGNAME=" + u.Name}
	if u.Shell != "" {
		env = append(env, "SHELL="+u.Shell)
	}
	vars := map[string]string{}
	var order []string
	add := func(k, v string) {
		if _, ok := vars[k]; !ok {
			order = append(order, k)
		}
		vars[k] = v
	}
	for _, kv := range env {
		k, v, _ := cutEnv(kv)
		add(k, v)
	}
	for _, kv := range s.environ() {
		k, v, _ := cutEnv(kv)
		if k == "PATH" {
			continue
		}
		add(k, v)
	}
	for _, k := range slices.Sorted(maps.Keys(extra)) {
		add(k, extra[k])
	}
	out := make([]string, 0, len(order))
	for _, k := range order {
		out = append(out, k+"="+vars[k])
	}
	return out
}

func cutEnv(kv string) (string, string, bool) {
	for i := 0; i < len(kv); i++ {
		if kv[i] == '=' {
			return kv[:i], kv[i+1:], true
		}
	}
	return kv, "", false
}

func (ps *processService) Update(_ context.Context, req *connect.Request[pb.UpdateRequest]) (*connect.Response[pb.UpdateResponse], error) {
	p, err := ps.s.procs.find(req.Msg.GetProcess())
	if err != nil {
		return nil, rpcErr(err)
	}
	if req.Msg.Pty != nil {
		if p.tty == nil {
			return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("process %d has no pty", p.pid))
		}
		size := req.Msg.GetPty().GetSize()
		if err := SetWinsize(p.tty, uint16(size.GetCols()), uint16(size.GetRows())); err != nil {
			return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("resize pty of %d: %w", p.pid, err))
		}
	}
	return connect.NewResponse(&pb.UpdateResponse{}), nil
}

func (ps *processService) SendInput(_ context.Context, req *connect.Request[pb.SendInputRequest]) (*connect.Response[pb.SendInputResponse], error) {
	p, err := ps.s.procs.find(req.Msg.GetProcess())
	if err != nil {
		return nil, rpcErr(err)
	}
	if err := p.writeInput(req.Msg.GetInput()); err != nil {
		return nil, rpcErr(err)
	}
	return connect.NewResponse(&pb.SendInputResponse{}), nil
}

func (ps *processService) StreamInput(ctx context.Context, stream *connect.ClientStream[pb.StreamInputRequest]) (*connect.Response[pb.StreamInputResponse], error) {
	var p *proc
	for stream.Receive() {
		switch ev := stream.Msg().GetEvent().(type) {
		case *pb.StreamInputRequest_Start:
			found, err := ps.s.procs.find(ev.Start.GetProcess())
			if err != nil {
				return nil, rpcErr(err)
			}
			p = found
		case *pb.StreamInputRequest_Data:
			if p == nil {
				return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("stream input: start event (process selector) must come first"))
			}
			if err := p.writeInput(ev.Data.GetInput()); err != nil {
				return nil, rpcErr(err)
			}
		case *pb.StreamInputRequest_Keepalive:
		}
	}
	if err := stream.Err(); err != nil {
		return nil, err
	}
	return connect.NewResponse(&pb.StreamInputResponse{}), nil
}

func (ps *processService) SendSignal(_ context.Context, req *connect.Request[pb.SendSignalRequest]) (*connect.Response[pb.SendSignalResponse], error) {
	p, err := ps.s.procs.find(req.Msg.GetProcess())
	if err != nil {
		return nil, rpcErr(err)
	}
	// The enum's values are the Linux signal numbers (SIGKILL=9,
	// SIGTERM=15); clients may send any other signal by number.
	n := int32(req.Msg.GetSignal())
	if n < 1 || n > 64 {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("signal %d: want 1-64", n))
	}
	sig := unix.Signal(n)
	if err := p.signal(sig); err != nil {
		return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("signal %d: %w", p.pid, err))
	}
	return connect.NewResponse(&pb.SendSignalResponse{}), nil
}

func (ps *processService) CloseStdin(_ context.Context, req *connect.Request[pb.CloseStdinRequest]) (*connect.Response[pb.CloseStdinResponse], error) {
	p, err := ps.s.procs.find(req.Msg.GetProcess())
	if err != nil {
		return nil, rpcErr(err)
	}
	if err := p.closeStdin(); err != nil {
		return nil, rpcErr(err)
	}
	return connect.NewResponse(&pb.CloseStdinResponse{}), nil
}
