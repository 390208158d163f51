package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"

	pb "github.com/berth-sandbox/berth/proto/process"
)

const (
	// outputChunk is the largest data event the agent sends.
	outputChunk = 32 << 10
	// subscriberBuffer is how many chunks one stream may lag behind before
	// the reader blocks. Output is never dropped while someone listens: a slow
	// client slows the process (its pipe fills and its writes block), so agent
	// memory per process stays below subscribers × subscriberBuffer × outputChunk.
	// With nobody listening, output is discarded, as envd does.
	subscriberBuffer = 64
	// drainGrace bounds how long output is read after the process exited; a
	// background grandchild that keeps the pipe open must not hold the end
	// event back forever.
	drainGrace = 200 * time.Millisecond
)

// proc is one process the agent started.
type proc struct {
	pid    int
	tag    *string
	config *pb.ProcessConfig

	tty   *os.File // PTY master; nil without a PTY
	stdin *os.File // write end of stdin pipe; nil when stdin is off or closed

	stdinMu sync.Mutex

	mu      sync.Mutex
	subs    map[chan *pb.ProcessEvent]struct{}
	end     *pb.ProcessEvent // set once the process ended and output drained
	endedCh chan struct{}    // closed when end is set

	readers sync.WaitGroup
	outputs []*os.File // read ends the readers drain
}

// subscribe registers a stream for the process's further data events. The
// channel is never closed: streams watch p.endedCh, then drain the channel
// and send p.end. Closing it instead would race with a blocked publish.
func (p *proc) subscribe() chan *pb.ProcessEvent {
	ch := make(chan *pb.ProcessEvent, subscriberBuffer)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.subs != nil {
		p.subs[ch] = struct{}{}
	}
	return ch
}

// unsubscribe detaches a stream that went away.
func (p *proc) unsubscribe(ch chan *pb.ProcessEvent) {
	p.mu.Lock()
	delete(p.subs, ch)
	p.mu.Unlock()
}

// publish hands ev to every subscriber, blocking on a full one: that is the
// backpressure. A subscriber that leaves is removed under p.mu, so publish
// re-checks membership while it waits.
func (p *proc) publish(ev *pb.ProcessEvent, done <-chan struct{}) {
	p.mu.Lock()
	subs := make([]chan *pb.ProcessEvent, 0, len(p.subs))
	for ch := range p.subs {
		subs = append(subs, ch)
	}
	p.mu.Unlock()
	for _, ch := range subs {
		p.sendTo(ch, ev, done)
	}
}

func (p *proc) sendTo(ch chan *pb.ProcessEvent, ev *pb.ProcessEvent, done <-chan struct{}) {
	select {
	case ch <- ev:
		return
	default:
	}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case ch <- ev:
			return
		case <-done:
			return
		case <-tick.C:
			p.mu.Lock()
			_, still := p.subs[ch]
			p.mu.Unlock()
			if !still {
				return
			}
		}
	}
}

// ended returns the end event once the process has ended, or nil.
func (p *proc) ended() *pb.ProcessEvent {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.end
}

func (p *proc) finish(end *pb.ProcessEvent) {
	p.mu.Lock()
	p.end = end
	p.subs = nil
	p.mu.Unlock()
	close(p.endedCh)
}

func (p *proc) readOutput(f *os.File, kind string, done <-chan struct{}) {
	defer p.readers.Done()
	for {
		buf := make([]byte, outputChunk)
		n, err := f.Read(buf)
		if n > 0 {
			data := &pb.ProcessEvent_DataEvent{}
			switch kind {
			case "stdout":
				data.Output = &pb.ProcessEvent_DataEvent_Stdout{Stdout: buf[:n]}
			case "stderr":
				data.Output = &pb.ProcessEvent_DataEvent_Stderr{Stderr: buf[:n]}
			default:
				data.Output = &pb.ProcessEvent_DataEvent_Pty{Pty: buf[:n]}
			}
			p.publish(&pb.ProcessEvent{Event: &pb.ProcessEvent_Data{Data: data}}, done)
		}
		if err != nil {
			return
		}
	}
}

// writeInput sends bytes to the process's stdin or PTY.
func (p *proc) writeInput(in *pb.ProcessInput) error {
	switch v := in.GetInput().(type) {
	case *pb.ProcessInput_Pty:
		if p.tty == nil {
			return fmt.Errorf("process %d has no pty, send stdin instead: %w", p.pid, errFailedPrecondition)
		}
		_, err := p.tty.Write(v.Pty)
		return err
	case *pb.ProcessInput_Stdin:
		if p.tty != nil {
			// A PTY process reads its stdin from the terminal.
			_, err := p.tty.Write(v.Stdin)
			return err
		}
		p.stdinMu.Lock()
		defer p.stdinMu.Unlock()
		if p.stdin == nil {
			return fmt.Errorf("stdin of process %d is not enabled or was closed: %w", p.pid, errFailedPrecondition)
		}
		_, err := p.stdin.Write(v.Stdin)
		return err
	default:
		return fmt.Errorf("input: %w", errInvalid)
	}
}

func (p *proc) closeStdin() error {
	if p.tty != nil {
		return fmt.Errorf("process %d has a pty: send Ctrl+D (0x04) instead: %w", p.pid, errFailedPrecondition)
	}
	p.stdinMu.Lock()
	defer p.stdinMu.Unlock()
	if p.stdin == nil {
		return nil
	}
	err := p.stdin.Close()
	p.stdin = nil
	return err
}

// signal sends sig to the process group the process leads (every process
// gets its own session), so a shell's children get it too.
func (p *proc) signal(sig unix.Signal) error {
	err := unix.Kill(-p.pid, sig)
	if errors.Is(err, unix.ESRCH) {
		err = unix.Kill(p.pid, sig)
	}
	if errors.Is(err, unix.ESRCH) {
		return nil // already gone; the end event says how
	}
	return err
}

// endEvent renders a wait status the way envd does (it reports Go's
// os.ProcessState): exit_code -1 and status "signal: killed" for a process
// killed by a signal, error set whenever the exit was not a clean 0.
func endEvent(st exitStatus) *pb.ProcessEvent {
	end := &pb.ProcessEvent_EndEvent{}
	if st.err != nil {
		msg := st.err.Error()
		end.ExitCode, end.Status, end.Error = -1, "unknown", &msg
	} else {
		ws := st.ws
		switch {
		case ws.Exited():
			end.Exited = true
			end.ExitCode = int32(ws.ExitStatus())
			end.Status = "exit status " + strconv.Itoa(ws.ExitStatus())
		case ws.Signaled():
			end.ExitCode = -1
			end.Status = "signal: " + ws.Signal().String()
		default:
			end.ExitCode = -1
		}
		if ws.CoreDump() {
			end.Status += " (core dumped)"
		}
		if !(ws.Exited() && ws.ExitStatus() == 0) {
			msg := end.Status
			end.Error = &msg
		}
	}
	return &pb.ProcessEvent{Event: &pb.ProcessEvent_End{End: end}}
}

// startSpec is a resolved StartRequest.
type startSpec struct {
	argv  []string
	env   []string
	dir   string
	user  *user
	pty   *pb.PTY
	stdin bool
}

// startProc forks the process and wires its output. ctx bounds nothing but
// the setup: the process lives as long as it likes.
func (t *procTable) startProc(spec startSpec, req *pb.StartRequest) (*proc, error) {
	cmd := exec.Command(spec.argv[0], spec.argv[1:]...)
	cmd.Path = spec.argv[0]
	if lp, err := lookPath(spec.argv[0], spec.env); err == nil {
		cmd.Path = lp
	} else {
		return nil, fmt.Errorf("command %q: %w: %w", spec.argv[0], err, errNotFound)
	}
	cmd.Args = spec.argv
	cmd.Env = spec.env
	cmd.Dir = spec.dir
	attr := &syscall.SysProcAttr{Setsid: true}
	if spec.user.UID != uint32(os.Getuid()) || spec.user.GID != uint32(os.Getgid()) || os.Getuid() == 0 {
		attr.Credential = &syscall.Credential{Uid: spec.user.UID, Gid: spec.user.GID, Groups: spec.user.Groups}
	}
	cmd.SysProcAttr = attr

	p := &proc{
		tag:     req.Tag,
		config:  req.GetProcess(),
		subs:    make(map[chan *pb.ProcessEvent]struct{}),
		endedCh: make(chan struct{}),
	}
	var childEnds []*os.File
	closeAll := func(fs []*os.File) {
		for _, f := range fs {
			if f != nil {
				f.Close()
			}
		}
	}
	var kinds []string
	if spec.pty != nil {
		master, slave, err := pty.Open()
		if err != nil {
			return nil, fmt.Errorf("open pty: %w", err)
		}
		cols, rows := spec.pty.GetSize().GetCols(), spec.pty.GetSize().GetRows()
		if cols == 0 {
			cols = 80
		}
		if rows == 0 {
			rows = 24
		}
		if err := pty.Setsize(master, &pty.Winsize{Cols: uint16(cols), Rows: uint16(rows)}); err != nil {
			closeAll([]*os.File{master, slave})
			return nil, fmt.Errorf("size pty: %w", err)
		}
		cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
		attr.Setctty = true
		attr.Ctty = 0
		childEnds = []*os.File{slave}
		p.tty = master
		p.outputs = []*os.File{master}
		kinds = []string{"pty"}
	} else {
		outR, outW, err := os.Pipe()
		if err != nil {
			return nil, err
		}
		errR, errW, err := os.Pipe()
		if err != nil {
			closeAll([]*os.File{outR, outW})
			return nil, err
		}
		cmd.Stdout, cmd.Stderr = outW, errW
		childEnds = []*os.File{outW, errW}
		p.outputs = []*os.File{outR, errR}
		kinds = []string{"stdout", "stderr"}
		if spec.stdin {
			inR, inW, err := os.Pipe()
			if err != nil {
				closeAll(append(childEnds, p.outputs...))
				return nil, err
			}
			cmd.Stdin = inR
			childEnds = append(childEnds, inR)
			p.stdin = inW
		}
		// Without stdin the child reads /dev/null (exec's default for nil).
	}

	pid, status, err := t.spawner.spawn(func() (int, error) {
		// The child inherits the agent's oom_score_adj at fork; see
		// workloadOOMScoreAdj.
		restore := t.oomForFork()
		defer restore()
		if err := cmd.Start(); err != nil {
			return 0, err
		}
		return cmd.Process.Pid, nil
	})
	closeAll(childEnds)
	if err != nil {
		closeAll(p.outputs)
		if p.stdin != nil {
			p.stdin.Close()
		}
		return nil, fmt.Errorf("start %q in %q: %w", spec.argv[0], spec.dir, classifyStartErr(err))
	}
	// Statuses come from the reaper; the pidfd os.Process may hold is not needed.
	_ = cmd.Process.Release()
	p.pid = pid

	done := make(chan struct{})
	for i, f := range p.outputs {
		p.readers.Add(1)
		go p.readOutput(f, kinds[i], done)
	}
	t.add(p)
	go func() {
		st := <-status
		// Read what the process left in its pipes, but don't wait forever for
		// descendants that inherited them.
		for _, f := range p.outputs {
			if err := f.SetReadDeadline(time.Now().Add(drainGrace)); err != nil {
				f.Close()
			}
		}
		waitTimeout(&p.readers, drainGrace+time.Second)
		close(done)
		for _, f := range p.outputs {
			f.Close()
		}
		p.stdinMu.Lock()
		if p.stdin != nil {
			p.stdin.Close()
			p.stdin = nil
		}
		p.stdinMu.Unlock()
		t.remove(p)
		p.finish(endEvent(st))
		t.logger.Info("process_end", "pid", pid, "status", st.ws)
	}()
	return p, nil
}

// workloadOOMScoreAdj is the oom_score_adj of every process the agent
// starts: the highest, so that when the sandbox's memory cgroup runs out the
// kernel kills the workload and not the agent (which the runtime starts at
// a lower score), and the sandbox stays reachable to report the OOM.
//
// Writing the child's /proc/<pid>/oom_score_adj after start leaves a window
// in which the child, already running, forks with the old score (the hostile
// suite's oom-score attack caught a shell's first child there). So the agent
// raises its own score around the fork instead and the child is born with
// it. Raising needs no privilege, and going back down is allowed as far as
// the floor the host set when it started the agent (oom_score_adj_min);
// forks are serialized so no other child sees the raised value by chance.
// The same floor lets a workload lower itself to the agent's score, never
// below: it can make itself as likely a victim as the agent, not less.
const workloadOOMScoreAdj = "1000"

const selfOOMScoreAdj = "/proc/self/oom_score_adj"

// oomForFork raises the agent's oom_score_adj for the fork that follows and
// returns the function that puts it back. Failures are logged, not fatal:
// outside a sandbox (tests) /proc may refuse.
func (t *procTable) oomForFork() (restore func()) {
	t.forkMu.Lock()
	old, err := os.ReadFile(selfOOMScoreAdj)
	if err == nil {
		err = os.WriteFile(selfOOMScoreAdj, []byte(workloadOOMScoreAdj), 0)
	}
	if err != nil {
		t.logger.Warn("oom_score_adj_failed", "err", err)
		return t.forkMu.Unlock
	}
	return func() {
		if err := os.WriteFile(selfOOMScoreAdj, old, 0); err != nil {
			t.logger.Warn("oom_score_adj_restore_failed", "err", err)
		}
		t.forkMu.Unlock()
	}
}

func waitTimeout(wg *sync.WaitGroup, d time.Duration) {
	ch := make(chan struct{})
	go func() { wg.Wait(); close(ch) }()
	select {
	case <-ch:
	case <-time.After(d):
	}
}

func classifyStartErr(err error) error {
	switch {
	case errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("%w: %w", err, errNotFound)
	case errors.Is(err, os.ErrPermission):
		return fmt.Errorf("%w: %w", err, errPermission)
	}
	return err
}

// lookPath finds file in the PATH of the process's own environment, not the
// agent's.
func lookPath(file string, env []string) (string, error) {
	path := ""
	for _, kv := range env {
		if len(kv) > 5 && kv[:5] == "PATH=" {
			path = kv[5:]
		}
	}
	return lookPathIn(file, path)
}

// procTable indexes running processes by pid and tag.
type procTable struct {
	spawner spawner
	logger  *slog.Logger
	// forkMu serializes forks while the agent's oom_score_adj is raised
	// for them (oomForFork).
	forkMu sync.Mutex

	mu    sync.Mutex
	byPID map[int]*proc
}

func (t *procTable) add(p *proc) {
	t.mu.Lock()
	t.byPID[p.pid] = p
	t.mu.Unlock()
}

func (t *procTable) remove(p *proc) {
	t.mu.Lock()
	if t.byPID[p.pid] == p {
		delete(t.byPID, p.pid)
	}
	t.mu.Unlock()
}

func (t *procTable) list() []*proc {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]*proc, 0, len(t.byPID))
	for _, p := range t.byPID {
		out = append(out, p)
	}
	return out
}

func (t *procTable) find(sel *pb.ProcessSelector) (*proc, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch s := sel.GetSelector().(type) {
	case *pb.ProcessSelector_Pid:
		if p, ok := t.byPID[int(s.Pid)]; ok {
			return p, nil
		}
		return nil, fmt.Errorf("process with pid %d: %w", s.Pid, errNotFound)
	case *pb.ProcessSelector_Tag:
		for _, p := range t.byPID {
			if p.tag != nil && *p.tag == s.Tag {
				return p, nil
			}
		}
		return nil, fmt.Errorf("process with tag %q: %w", s.Tag, errNotFound)
	default:
		return nil, fmt.Errorf("process selector (pid or tag) is required: %w", errInvalid)
	}
}

// killAll ends every process; used when the server closes.
func (t *procTable) killAll(ctx context.Context) {
	for _, p := range t.list() {
		_ = p.signal(unix.SIGKILL)
		select {
		case <-p.endedCh:
		case <-ctx.Done():
			return
		}
	}
}
