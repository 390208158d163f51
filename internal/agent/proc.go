package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"time"

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
	// drainGrace is how long the readers wait for more output once the
	// process exited: a background grandchild that keeps the pipe open must
	// not hold the end event back forever. It bounds waiting only, never
	// reading: what the process left in its pipe is read however late the
	// reader gets to it (see readOutput).
	drainGrace = 200 * time.Millisecond
	// drainBudget bounds what is read once drainGrace ran out, when the
	// pipe's capacity is not known (a PTY): a grandchild writing without
	// pause must not keep the readers busy forever either.
	drainBudget = 1 << 20
	// timeoutExitCode is the exit code of a process killed at its time
	// limit, as coreutils' timeout reports it.
	timeoutExitCode = 124
)

// proc is one process the agent started.
type proc struct {
	pid    int
	tag    *string
	config *pb.ProcessConfig

	tty   *os.File // PTY master; nil without a PTY
	stdin *os.File // write end of stdin pipe; nil when stdin is off or closed
	// ptySignals: the agent makes the PTY's signals (ptysig.go).
	ptySignals bool

	stdinMu sync.Mutex

	mu      sync.Mutex
	subs    map[chan *pb.ProcessEvent]struct{}
	end     *pb.ProcessEvent // set once the process ended and output drained
	endedCh chan struct{}    // closed when end is set

	readers sync.WaitGroup
	outputs []*os.File // read ends the readers drain

	// limit is the time limit's timer; nil without one. timedOut is set
	// (under mu) just before the limit's kill, so the end event can tell
	// a kill at the limit from any other; limitCode says whether that end
	// reports exit code 124 (Berth's timeout_ms) or the signal as envd
	// does for Connect-Timeout-Ms.
	limit     *time.Timer
	exited    bool // the process's own status is in
	timedOut  bool
	limitCode bool
	limitText string
	// pidsKilled, when set, is why the pids killer ended the process.
	pidsKilled string
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
func (p *proc) publish(ev *pb.ProcessEvent) {
	p.mu.Lock()
	subs := make([]chan *pb.ProcessEvent, 0, len(p.subs))
	for ch := range p.subs {
		subs = append(subs, ch)
	}
	p.mu.Unlock()
	for _, ch := range subs {
		p.sendTo(ch, ev)
	}
}

// sendTo waits as long as the subscriber stays: output is delivered to a
// slow stream, never dropped; one that leaves stops the wait.
func (p *proc) sendTo(ch chan *pb.ProcessEvent, ev *pb.ProcessEvent) {
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

// readOutput publishes what the process writes to f until every writer
// closed it. Once the process exited, f has a read deadline (drainGrace
// after the exit); when it passes, the reader goes on as long as the pipe
// still holds bytes, up to the pipe's capacity more: everything the process
// wrote before it exited is then read, however long the reader was kept from
// it (a slow subscriber, a loaded CPU), while a grandchild that keeps
// writing cannot hold the end back.
func (p *proc) readOutput(f *os.File, kind string) {
	defer p.readers.Done()
	late := false // the drain deadline passed once
	budget := 0   // bytes still allowed since then
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
			p.publish(&pb.ProcessEvent{Event: &pb.ProcessEvent_Data{Data: data}})
		}
		if late {
			if budget -= n; budget <= 0 {
				return
			}
		}
		if err == nil {
			continue
		}
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			return
		}
		if !late {
			// What the process wrote before it exited and is still unread
			// is at the front of the pipe, which holds no more than its
			// capacity: reading that much more reads all of it.
			late, budget = true, pipeCapacity(f)
		}
		if pending(f) <= 0 {
			return
		}
		// Bytes are waiting: a new deadline lets the next Read take them
		// (one past due fails before reading).
		if f.SetReadDeadline(time.Now().Add(drainGrace)) != nil {
			return
		}
	}
}

// pending is how many bytes f's pipe or terminal holds unread
// (TIOCINQ is FIONREAD: it answers for pipes and PTY masters alike).
func pending(f *os.File) int {
	n := 0
	rc, err := f.SyscallConn()
	if err != nil {
		return 0
	}
	_ = rc.Control(func(fd uintptr) {
		if v, err := unix.IoctlGetInt(int(fd), unix.TIOCINQ); err == nil {
			n = v
		}
	})
	return n
}

// pipeCapacity is how many bytes f's pipe can hold, drainBudget for
// anything that is not a pipe.
func pipeCapacity(f *os.File) int {
	n := drainBudget
	rc, err := f.SyscallConn()
	if err != nil {
		return n
	}
	_ = rc.Control(func(fd uintptr) {
		if v, err := unix.FcntlInt(fd, unix.F_GETPIPE_SZ, 0); err == nil && v > 0 {
			n = v
		}
	})
	return n
}

// writeInput sends bytes to the process's stdin or PTY.
func (p *proc) writeInput(in *pb.ProcessInput) error {
	switch v := in.GetInput().(type) {
	case *pb.ProcessInput_Pty:
		if p.tty == nil {
			return fmt.Errorf("process %d has no pty, send stdin instead: %w", p.pid, errFailedPrecondition)
		}
		return p.writeTTY(v.Pty)
	case *pb.ProcessInput_Stdin:
		if p.tty != nil {
			// A PTY process reads its stdin from the terminal.
			return p.writeTTY(v.Stdin)
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
	// limit, when positive, is the process's time limit; limitCode makes
	// a kill at the limit end with exit code 124 (timeout_ms) instead of
	// reporting the signal (Connect-Timeout-Ms, as envd does).
	limit     time.Duration
	limitCode bool
}

// startProc forks the process and wires its output. The returned channel is
// the caller's subscription to the process's events, registered before the
// output readers start: a process may print and exit before startProc
// returns, and none of that output may be published to nobody. The caller
// unsubscribes when done.
func (t *procTable) startProc(spec startSpec, req *pb.StartRequest) (*proc, chan *pb.ProcessEvent, error) {
	cmd := exec.Command(spec.argv[0], spec.argv[1:]...)
	cmd.Path = spec.argv[0]
	if lp, err := lookPath(spec.argv[0], spec.env); err == nil {
		cmd.Path = lp
	} else {
		return nil, nil, fmt.Errorf("command %q: %w: %w", spec.argv[0], err, errNotFound)
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
		master, slave, err := OpenPTY()
		if err != nil {
			return nil, nil, fmt.Errorf("open pty: %w", err)
		}
		cols, rows := spec.pty.GetSize().GetCols(), spec.pty.GetSize().GetRows()
		if cols == 0 {
			cols = 80
		}
		if rows == 0 {
			rows = 24
		}
		if err := SetWinsize(master, uint16(cols), uint16(rows)); err != nil {
			closeAll([]*os.File{master, slave})
			return nil, nil, fmt.Errorf("size pty: %w", err)
		}
		cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
		attr.Setctty = true
		attr.Ctty = 0
		childEnds = []*os.File{slave}
		p.tty = master
		p.ptySignals = t.ptySignals
		p.outputs = []*os.File{master}
		kinds = []string{"pty"}
	} else {
		outR, outW, err := os.Pipe()
		if err != nil {
			return nil, nil, err
		}
		errR, errW, err := os.Pipe()
		if err != nil {
			closeAll([]*os.File{outR, outW})
			return nil, nil, err
		}
		cmd.Stdout, cmd.Stderr = outW, errW
		childEnds = []*os.File{outW, errW}
		p.outputs = []*os.File{outR, errR}
		kinds = []string{"stdout", "stderr"}
		if spec.stdin {
			inR, inW, err := os.Pipe()
			if err != nil {
				closeAll(append(childEnds, p.outputs...))
				return nil, nil, err
			}
			cmd.Stdin = inR
			childEnds = append(childEnds, inR)
			p.stdin = inW
		}
		// Without stdin the child reads /dev/null (exec's default for nil).
	}

	// The child inherits the agent's oom_score_adj at fork; see
	// workloadOOMScoreAdj. The fork lock is taken before the reaper's
	// (spawn), never inside it: the pids killer holds the fork lock while
	// it waits for the reaper to collect what it killed, so a start that
	// waited for the fork lock while holding the reaper's would stop all
	// reaping until the killer gave up.
	restore := t.oomForFork()
	pid, status, err := t.spawner.spawn(func() (int, error) {
		start := cmd.Start
		if t.pids != nil {
			start = func() error { return t.pids.fork(cmd.Start) }
		}
		if err := start(); err != nil {
			return 0, err
		}
		return cmd.Process.Pid, nil
	})
	restore()
	closeAll(childEnds)
	if err != nil {
		closeAll(p.outputs)
		if p.stdin != nil {
			p.stdin.Close()
		}
		return nil, nil, fmt.Errorf("start %q in %q: %w", spec.argv[0], spec.dir, classifyStartErr(err))
	}
	// Statuses come from the reaper; the pidfd os.Process may hold is not needed.
	_ = cmd.Process.Release()
	p.pid = pid

	sub := p.subscribe()
	if spec.limit > 0 {
		p.mu.Lock()
		p.limitCode = spec.limitCode
		p.limitText = spec.limit.String()
		p.limit = time.AfterFunc(spec.limit, p.expire)
		p.mu.Unlock()
	}
	for i, f := range p.outputs {
		p.readers.Add(1)
		go p.readOutput(f, kinds[i])
	}
	t.add(p)
	go func() {
		st := <-status
		p.mu.Lock()
		p.exited = true
		if p.limit != nil {
			p.limit.Stop()
		}
		p.mu.Unlock()
		// Read what the process left in its pipes, but don't wait forever for
		// descendants that inherited them (readOutput).
		for _, f := range p.outputs {
			if err := f.SetReadDeadline(time.Now().Add(drainGrace)); err != nil {
				f.Close()
			}
		}
		p.readers.Wait()
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
		p.finish(p.endEvent(st))
		t.logger.Info("process_end", "pid", pid, "status", st.ws)
	}()
	if t.afterStart != nil {
		t.afterStart(p)
	}
	return p, sub, nil
}

// expire kills the process's group at its time limit.
func (p *proc) expire() {
	p.mu.Lock()
	if p.exited {
		p.mu.Unlock()
		return
	}
	p.timedOut = true
	p.mu.Unlock()
	_ = p.signal(unix.SIGKILL)
}

// expired says the process was killed at its time limit.
func (p *proc) expired() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.timedOut
}

// endEvent renders st, reporting a kill at a timeout_ms limit as exit code
// 124. A process that ended on its own just before the limit's kill landed
// keeps its own status.
func (p *proc) endEvent(st exitStatus) *pb.ProcessEvent {
	p.mu.Lock()
	timedOut, code, limit, pidsKilled := p.timedOut, p.limitCode, p.limitText, p.pidsKilled
	p.mu.Unlock()
	if pidsKilled != "" && st.err == nil && st.ws.Signaled() && st.ws.Signal() == unix.SIGKILL {
		// The status stays Go's, which clients parse into 137; the
		// error says why.
		msg := "signal: killed: " + pidsKilled
		return &pb.ProcessEvent{Event: &pb.ProcessEvent_End{End: &pb.ProcessEvent_EndEvent{
			ExitCode: -1,
			Status:   "signal: killed",
			Error:    &msg,
		}}}
	}
	if !timedOut || !code || st.err != nil || !st.ws.Signaled() || st.ws.Signal() != unix.SIGKILL {
		return endEvent(st)
	}
	msg := "timed out after " + limit
	return &pb.ProcessEvent{Event: &pb.ProcessEvent_End{End: &pb.ProcessEvent_EndEvent{
		ExitCode: timeoutExitCode,
		Status:   msg,
		Error:    &msg,
	}}}
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
// What a running process can see is the agent at that score for the moment
// of a fork (until cmd.Start returns), its own start included: a child that
// reads /proc/1 at once may still find it raised. Holding the child at its
// exec until the agent is back down needs ptrace, which the sandbox's
// seccomp profile denies; a shim exec in between costs ~2 ms per start.
// The window is harmless to the choice of victim: at equal scores the OOM
// killer takes the larger process, and the agent is the smaller.
// The same floor lets a workload lower itself to the agent's score, never
// below: it can make itself as likely a victim as the agent, not less.
const workloadOOMScoreAdj = "1000"

const selfOOMScoreAdj = "/proc/self/oom_score_adj"

// oomForFork raises the agent's oom_score_adj for the fork that follows and
// returns the function that puts it back. Failures are logged, not fatal:
// outside a sandbox (tests) /proc may refuse. The file stays open (under
// forkMu): three system calls per fork, where opening, reading or
// writing, and closing it for each access took about twenty (strace).
func (t *procTable) oomForFork() (restore func()) {
	t.forkMu.Lock()
	var old []byte
	err := t.openOOMAdj()
	if err == nil {
		var buf [16]byte
		var n int
		n, err = t.oomAdj.ReadAt(buf[:], 0)
		if errors.Is(err, io.EOF) && n > 0 {
			err = nil
		}
		old = buf[:n]
	}
	if err == nil {
		_, err = t.oomAdj.WriteAt([]byte(workloadOOMScoreAdj), 0)
	}
	if err != nil {
		t.logger.Warn("oom_score_adj_failed", "err", err)
		return t.forkMu.Unlock
	}
	return func() {
		if _, err := t.oomAdj.WriteAt(old, 0); err != nil {
			t.logger.Warn("oom_score_adj_restore_failed", "err", err)
		}
		t.forkMu.Unlock()
	}
}

// openOOMAdj opens the agent's own oom_score_adj once; forkMu is held.
func (t *procTable) openOOMAdj() error {
	if t.oomAdj != nil {
		return nil
	}
	f, err := os.OpenFile(selfOOMScoreAdj, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	t.oomAdj = f
	return nil
}

func classifyStartErr(err error) error {
	switch {
	case errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("%w: %w", err, errNotFound)
	case errors.Is(err, os.ErrPermission):
		return fmt.Errorf("%w: %w", err, errPermission)
	case errors.Is(err, unix.EAGAIN):
		// The fork was refused: the sandbox is at its pids limit.
		return fmt.Errorf("%w (the sandbox is at its process limit): %w", err, errResourceExhausted)
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
	// ptySignals is Config.PTYSignals.
	ptySignals bool
	// pids is Config.Pids: processes are started in its cgroup.
	pids *PidsCgroup
	// forkMu serializes forks while the agent's oom_score_adj is raised
	// for them (oomForFork), and holds them off while the pids killer
	// empties the sandbox. Lock order: forkMu, then the reaper's lock.
	forkMu sync.Mutex
	// oomAdj is /proc/self/oom_score_adj (oomForFork), held open once
	// used; forkMu guards it.
	oomAdj *os.File

	mu    sync.Mutex
	byPID map[int]*proc

	// afterStart, when set (tests only), runs once a process's output
	// readers are running, before startProc returns: a test holds it to
	// let a fast process end before the caller goes on.
	afterStart func(*proc)
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
