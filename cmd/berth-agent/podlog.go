package main

import (
	"bufio"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-sandbox/berth/internal/agent"
	"github.com/berth-sandbox/berth/internal/crilog"
)

// podLogDrain bounds how long the log's readers wait for more output once
// the command exited: a background grandchild that keeps its stdout open
// must not keep the container from ending (in Kubernetes it would die
// with the container).
const podLogDrain = 200 * time.Millisecond

// podLogDrainBudget bounds what is read once the command exited, so a
// grandchild writing without pause cannot keep the container running.
const podLogDrainBudget = 1 << 20

// podLog is `berth-agent podlog -log FILE -exit FILE [-run FILE -restart N]
// -- CMD [ARG…]`, the process a Kubernetes node runs each container as: it
// runs CMD with its stdout and stderr written to FILE as CRI log records,
// each timed as it is read, then writes CMD's exit code (128+n for signal
// n, 127 when CMD is not found, as sh reports) to the exit file, renamed
// into place so a reader never sees half of it. The run file, when named,
// records which run of the container this is (N, the restarts before it)
// and when it started.
//
// `berth-agent podlog -rotate -log FILE -exit FILE -run FILE` runs nothing:
// it keeps a container's last run's files beside them (crilog.Previous),
// replacing the run before, as the kubelet keeps one previous log per
// container for `kubectl logs --previous`. The node runs it, and waits for
// it, before it restarts a container.
//
// A container with stdin (-stdin FIFO) reads what is written into that
// FIFO, which the wrapper makes: each writer's bytes in turn, for as long
// as the command runs, or (-stdin-once) the first writer's only, after
// which the command's stdin ends. A container with a terminal (-tty) runs
// on a PTY of its own: its output, one stream, is logged as stdout, its
// input goes to the terminal (-stdin-once does not close a terminal: the
// program on it ends when told to, as after kubectl run -it), and each
// "COLS ROWS" line written into the -resize FIFO sets the terminal's
// size. `berth-agent podlog-input` is
// such a writer (the node runs one per kubectl attach -i).
//
// Both run as ordinary processes of the sandbox, with nothing of the
// agent's.
func podLog(args []string) int {
	fs := flag.NewFlagSet("podlog", flag.ContinueOnError)
	var r podRun
	fs.StringVar(&r.log, "log", "", "log file to append records to")
	fs.StringVar(&r.exit, "exit", "", "file to write the exit code to")
	fs.StringVar(&r.run, "run", "", "file to record the run's restart count and start time in")
	fs.IntVar(&r.restart, "restart", 0, "restarts of the container before this run")
	fs.StringVar(&r.in.stdin, "stdin", "", "FIFO to make and read the command's stdin from")
	fs.BoolVar(&r.in.once, "stdin-once", false, "end the command's stdin once the first writer of -stdin closed it")
	fs.BoolVar(&r.in.tty, "tty", false, "run the command on a terminal")
	fs.StringVar(&r.in.resize, "resize", "", "FIFO to make and read the terminal's size from (COLS ROWS lines)")
	rotate := fs.Bool("rotate", false, "keep the last run's files as the previous run's and run nothing")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if r.in.resize != "" && !r.in.tty || r.in.once && r.in.stdin == "" {
		fmt.Fprintln(os.Stderr, "berth-agent podlog: -resize needs -tty, -stdin-once needs -stdin")
		return 2
	}
	if r.log == "" || r.exit == "" || (fs.NArg() == 0) != *rotate || r.restart < 0 {
		fmt.Fprintln(os.Stderr, "usage: berth-agent podlog -log FILE -exit FILE [-run FILE -restart N] -- CMD [ARG...]\n"+
			"       berth-agent podlog -rotate -log FILE -exit FILE [-run FILE]")
		return 2
	}
	if *rotate {
		if err := r.rotate(); err != nil {
			fmt.Fprintln(os.Stderr, "berth-agent podlog:", err)
			return 1
		}
		return 0
	}
	code, err := r.runLogged(fs.Args())
	if err != nil {
		fmt.Fprintln(os.Stderr, "berth-agent podlog:", err)
		return 1
	}
	return code
}

// podRun is one run of a container: where its files go.
type podRun struct {
	log, exit, run string
	restart        int
	in             podInput
}

// podInput is how a container's command gets input: none, a stdin
// (FIFO), a terminal.
type podInput struct {
	stdin, resize string // FIFOs
	once, tty     bool
}

// runLogged runs argv with its output logged and returns its exit code.
func (r podRun) runLogged(argv []string) (int, error) {
	if err := os.MkdirAll(filepath.Dir(r.log), 0o755); err != nil {
		return -1, err
	}
	if r.run != "" {
		rec := crilog.Run{Restart: r.restart, Started: time.Now()}
		if err := writeAtomic(r.run, rec.Append(nil)); err != nil {
			return -1, err
		}
	}
	f, err := os.OpenFile(r.log, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return -1, err
	}
	defer f.Close()
	w := crilog.NewWriter(f, time.Now)
	code, err := runCopying(w, argv, r.in)
	if err != nil {
		return -1, err
	}
	if err := writeAtomic(r.exit, []byte(strconv.Itoa(code)+"\n")); err != nil {
		return -1, err
	}
	return code, nil
}

// rotate keeps the last run's files as the previous run's. The exit file
// goes first: while a run's exit code is in place, so is its whole log.
func (r podRun) rotate() error {
	for _, p := range []string{r.exit, r.log, r.run} {
		if p == "" {
			continue
		}
		if err := os.Rename(p, p+crilog.Previous); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return nil
}

// writeAtomic writes b to path through a temporary file renamed into place.
func writeAtomic(path string, b []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// podKillSignal, sent to the wrapper, SIGKILLs its command's group (the
// node's internal/kube/node sends it as killSignal).
const podKillSignal = syscall.SIGUSR1

func runCopying(w *crilog.Writer, argv []string, in podInput) (int, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	// What the command writes is read from outs, as the stream named; the
	// command's ends are closed here once it started.
	type out struct {
		name string
		r    *os.File
	}
	var outs []out
	var theirs []*os.File
	defer func() {
		for _, f := range theirs {
			f.Close()
		}
		for _, o := range outs {
			o.r.Close()
		}
	}()
	var input *os.File // where the command's input is written
	if in.tty {
		master, replica, err := agent.OpenPTY()
		if err != nil {
			return -1, err
		}
		theirs = append(theirs, replica)
		outs = append(outs, out{crilog.Stdout, master})
		input = master
		cmd.Stdin, cmd.Stdout, cmd.Stderr = replica, replica, replica
		// A session of its own with the terminal as its controlling
		// one; it leads its process group as below.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	} else {
		for _, name := range []string{crilog.Stdout, crilog.Stderr} {
			r, w, err := os.Pipe()
			if err != nil {
				return -1, err
			}
			outs = append(outs, out{name, r})
			theirs = append(theirs, w)
		}
		cmd.Stdout, cmd.Stderr = theirs[0], theirs[1]
		if in.stdin != "" {
			r, w, err := os.Pipe()
			if err != nil {
				return -1, err
			}
			theirs = append(theirs, r)
			cmd.Stdin, input = r, w
			defer w.Close()
		}
		// The command leads a process group of its own: a signal to this
		// wrapper's group reaches the command once (forwarded below), and
		// KillSignal ends the command's whole group.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	}
	// The FIFOs are made and opened before the command starts, so a
	// writer that comes once the container runs finds a reader; opened
	// for writing too, so that no writer's close reads as an end (the
	// input's frames say where a writer's input ends: podlog-input).
	fifos := map[string]*os.File{}
	for _, fifo := range []string{in.stdin, in.resize} {
		if fifo == "" {
			continue
		}
		_ = os.Remove(fifo) // a run before's
		if err := syscall.Mkfifo(fifo, 0o600); err != nil {
			return -1, fmt.Errorf("make %s: %w", fifo, err)
		}
		defer os.Remove(fifo)
		f, err := os.OpenFile(fifo, os.O_RDWR, 0)
		if err != nil {
			return -1, err
		}
		defer f.Close()
		fifos[fifo] = f
	}
	err := cmd.Start()
	for _, f := range theirs {
		f.Close()
	}
	theirs = nil
	if err != nil {
		code := 126
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
			code = 127
		}
		msg := fmt.Sprintf("%s: %v\n", argv[0], err)
		if werr := w.Copy(crilog.Stderr, strings.NewReader(msg)); werr != nil {
			return -1, werr
		}
		return code, nil
	}
	if in.stdin != "" {
		go feedInput(fifos[in.stdin], input, in.once && !in.tty)
	}
	if in.resize != "" {
		go resizeFrom(fifos[in.resize], input)
	}
	// The container's signals are its command's (a node deleting the pod
	// stops the sandbox anyway; a user's kill reaches the command), but
	// podKillSignal, the node's kill after a failed probe's grace period,
	// which ends the command's group with SIGKILL: its exit is then
	// recorded, as a SIGKILL to this wrapper would not let it be.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT, podKillSignal)
	defer signal.Stop(sigs)
	stop := make(chan struct{})
	var fwd sync.WaitGroup
	fwd.Add(1)
	go func() {
		defer fwd.Done()
		for {
			select {
			case s := <-sigs:
				if s == podKillSignal {
					_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
					continue
				}
				_ = cmd.Process.Signal(s)
			case <-stop:
				return
			}
		}
	}()

	var exited atomic.Bool
	var copiers sync.WaitGroup
	copyErr := make([]error, len(outs))
	for i, o := range outs {
		copiers.Add(1)
		go func() {
			defer copiers.Done()
			copyErr[i] = w.Copy(o.name, &drainReader{f: o.r, exited: &exited, budget: podLogDrainBudget})
		}()
	}
	waitErr := cmd.Wait()
	close(stop)
	fwd.Wait()
	// What the command left in the pipes is read, however long that
	// takes; a grandchild still holding them open is waited for only
	// while it keeps writing, and only so much.
	exited.Store(true)
	deadline := time.Now().Add(podLogDrain)
	for _, o := range outs {
		_ = o.r.SetReadDeadline(deadline)
	}
	copiers.Wait()
	for _, err := range copyErr {
		if err != nil {
			return -1, err
		}
	}
	var ee *exec.ExitError
	if waitErr != nil && !errors.As(waitErr, &ee) {
		return -1, waitErr
	}
	st := cmd.ProcessState.Sys().(syscall.WaitStatus)
	if st.Signaled() {
		return 128 + int(st.Signal()), nil
	}
	return st.ExitStatus(), nil
}

// A writer's input goes into a container's stdin FIFO in frames: a
// 4-byte big-endian length, then that many bytes, each frame in one
// write of at most PIPE_BUF bytes, so that two writers' frames never
// interleave; an empty frame ends the writer's input.
const inputFrameMax = 4096 - 4

// feedInput copies the input framed in fifo to the command's input w for
// as long as the wrapper runs; once, until the first writer's input
// ended, and then it closes w (the command's stdin ends) and the FIFO (a
// later writer finds no reader and is refused).
func feedInput(fifo, w *os.File, once bool) {
	var hdr [4]byte
	buf := make([]byte, inputFrameMax)
	for {
		if _, err := io.ReadFull(fifo, hdr[:]); err != nil {
			return
		}
		n := binary.BigEndian.Uint32(hdr[:])
		if n == 0 {
			if once {
				w.Close()
				fifo.Close()
				return
			}
			continue
		}
		if n > inputFrameMax {
			return // not a frame of ours: stop reading
		}
		if _, err := io.ReadFull(fifo, buf[:n]); err != nil {
			return
		}
		_, _ = w.Write(buf[:n]) // a command that stopped reading loses it
	}
}

// resizeFrom sets the terminal's size (its master, m) from each
// "COLS ROWS" line read from fifo.
func resizeFrom(fifo, m *os.File) {
	sc := bufio.NewScanner(fifo)
	for sc.Scan() {
		var cols, rows uint16
		if _, err := fmt.Sscanf(sc.Text(), "%d %d", &cols, &rows); err == nil && cols > 0 && rows > 0 {
			_ = agent.SetWinsize(m, cols, rows)
		}
	}
}

// podInputCmd is `berth-agent podlog-input -fifo FIFO`: it copies its own
// stdin into a container's stdin FIFO (podlog -stdin) until it ends, or
// with -cols C -rows R writes that size into a terminal's resize FIFO. A
// FIFO nobody reads (the container is not running) fails at once.
func podInputCmd(args []string) int {
	fs := flag.NewFlagSet("podlog-input", flag.ContinueOnError)
	fifo := fs.String("fifo", "", "the container's stdin or resize FIFO")
	cols := fs.Int("cols", 0, "with -rows: write this size instead of copying stdin")
	rows := fs.Int("rows", 0, "with -cols: write this size instead of copying stdin")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *fifo == "" || fs.NArg() > 0 || (*cols > 0) != (*rows > 0) {
		fmt.Fprintln(os.Stderr, "usage: berth-agent podlog-input -fifo FIFO [-cols C -rows R]")
		return 2
	}
	if err := awaitFile(*fifo, fifoWait); err != nil {
		fmt.Fprintln(os.Stderr, "berth-agent podlog-input:", err)
		return 1
	}
	// Non-blocking open: no reader is an error now (ENXIO), not a wait;
	// in Go's poller, the writes below still wait for room.
	f, err := os.OpenFile(*fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		fmt.Fprintln(os.Stderr, "berth-agent podlog-input: the container does not read it:", err)
		return 1
	}
	defer f.Close()
	if *cols > 0 {
		_, err = fmt.Fprintf(f, "%d %d\n", *cols, *rows)
	} else {
		err = writeFrames(f, os.Stdin)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "berth-agent podlog-input:", err)
		return 1
	}
	return 0
}

// fifoWait bounds podlog-input's wait for a container's FIFO: the node
// may ask as the container's wrapper starts, before it made it.
const fifoWait = 30 * time.Second

// writeFrames writes r's bytes into w as input frames (feedInput), then
// the empty frame that ends them.
func writeFrames(w io.Writer, r io.Reader) error {
	buf := make([]byte, 4+inputFrameMax)
	for {
		n, err := r.Read(buf[4:])
		if n > 0 {
			binary.BigEndian.PutUint32(buf[:4], uint32(n))
			if _, werr := w.Write(buf[:4+n]); werr != nil {
				return werr
			}
		}
		if errors.Is(err, io.EOF) {
			// The end frame finds no reader when the command took its
			// input and ended meanwhile: nothing was lost.
			if _, err = w.Write(make([]byte, 4)); errors.Is(err, syscall.EPIPE) {
				return nil
			}
			return err
		}
		if err != nil {
			return err
		}
	}
}

// awaitFile returns once path exists, or fails after limit: it watches
// path's directory (inotify) rather than polling.
func awaitFile(path string, limit time.Duration) error {
	if _, err := os.Lstat(path); err == nil {
		return nil
	}
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if _, err := unix.InotifyAddWatch(fd, filepath.Dir(path), unix.IN_CREATE|unix.IN_MOVED_TO); err != nil {
		return fmt.Errorf("watch %s: %w", filepath.Dir(path), err)
	}
	deadline := time.Now().Add(limit)
	buf := make([]byte, 4096)
	for {
		if _, err := os.Lstat(path); err == nil {
			return nil // made before the watch, or since
		}
		left := time.Until(deadline)
		if left <= 0 {
			return fmt.Errorf("%s: not made within %s (the container is not running)", path, limit)
		}
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		if _, err := unix.Poll(fds, int(left.Milliseconds())+1); err != nil && !errors.Is(err, unix.EINTR) {
			return err
		}
		_, _ = unix.Read(fd, buf) // the events themselves say nothing more
	}
}

// drainReader reads a command's output pipe. Once the command exited,
// each read waits at most podLogDrain for data and all of them together
// read at most the budget; then the pipe reads as ended.
type drainReader struct {
	f      *os.File
	exited *atomic.Bool
	budget int
}

func (d *drainReader) Read(p []byte) (int, error) {
	after := d.exited.Load()
	if after {
		if d.budget <= 0 {
			return 0, io.EOF
		}
		if len(p) > d.budget {
			p = p[:d.budget]
		}
		// Set before each read: a deadline bounds only the wait, data
		// already in the pipe is read at once.
		_ = d.f.SetReadDeadline(time.Now().Add(podLogDrain))
	}
	n, err := d.f.Read(p)
	if after {
		d.budget -= n
	}
	// EIO: a terminal's master once no process has the terminal open.
	if errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, syscall.EIO) {
		return n, io.EOF
	}
	return n, err
}
