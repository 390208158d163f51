package main

import (
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
// Both run as ordinary processes of the sandbox, with nothing of the
// agent's.
func podLog(args []string) int {
	fs := flag.NewFlagSet("podlog", flag.ContinueOnError)
	var r podRun
	fs.StringVar(&r.log, "log", "", "log file to append records to")
	fs.StringVar(&r.exit, "exit", "", "file to write the exit code to")
	fs.StringVar(&r.run, "run", "", "file to record the run's restart count and start time in")
	fs.IntVar(&r.restart, "restart", 0, "restarts of the container before this run")
	rotate := fs.Bool("rotate", false, "keep the last run's files as the previous run's and run nothing")
	if err := fs.Parse(args); err != nil {
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
	code, err := runCopying(w, argv)
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

func runCopying(w *crilog.Writer, argv []string) (int, error) {
	outR, outW, err := os.Pipe()
	if err != nil {
		return -1, err
	}
	defer outR.Close()
	errR, errW, err := os.Pipe()
	if err != nil {
		outW.Close()
		return -1, err
	}
	defer errR.Close()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = outW, errW
	// The command leads a process group of its own: a signal to this
	// wrapper's group reaches the command once (forwarded below), and
	// KillSignal ends the command's whole group.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	err = cmd.Start()
	outW.Close()
	errW.Close()
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
	var copyErr [2]error
	for i, s := range []struct {
		name string
		r    *os.File
	}{{crilog.Stdout, outR}, {crilog.Stderr, errR}} {
		copiers.Add(1)
		go func() {
			defer copiers.Done()
			copyErr[i] = w.Copy(s.name, &drainReader{f: s.r, exited: &exited, budget: podLogDrainBudget})
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
	_ = outR.SetReadDeadline(deadline)
	_ = errR.SetReadDeadline(deadline)
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
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return n, io.EOF
	}
	return n, err
}
