package agent

import (
	"fmt"
	"os"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"
)

// OpenPTY opens a PTY pair whose master is non-blocking, in Go's poller,
// so that a read deadline can end a read on it.
//
// pty.Open reads the master's descriptor with Fd(), which puts the file in
// blocking mode: a Read then blocks in the kernel, where no deadline
// reaches it. On Linux that read fails with EIO once the last replica
// descriptor closes (the process and its children exited), so blocking was
// harmless; gVisor's sentry (runsc 2022, gVisor issue 9333) never ends it,
// so the agent waited forever for the output of a shell that had exited
// and never reported its end. A duplicate of the master in non-blocking
// mode goes back in the poller, where the drain after exit
// (startProc) ends it. Touch it only through SyscallConn from here on:
// Fd() would make it blocking again.
func OpenPTY() (master, replica *os.File, err error) {
	m, r, err := pty.Open()
	if err != nil {
		return nil, nil, err
	}
	fd, err := unix.FcntlInt(m.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	m.Close()
	if err == nil {
		err = unix.SetNonblock(fd, true)
		if err != nil {
			unix.Close(fd)
		}
	}
	if err != nil {
		r.Close()
		return nil, nil, fmt.Errorf("pty master: %w", err)
	}
	return os.NewFile(uintptr(fd), "/dev/ptmx"), r, nil
}

// ttyControl runs fn with f's descriptor without taking it out of the
// poller (as Fd() would).
func ttyControl(f *os.File, fn func(fd int) error) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) { ferr = fn(int(fd)) }); err != nil {
		return err
	}
	return ferr
}

// SetWinsize sets a PTY's window size.
func SetWinsize(f *os.File, cols, rows uint16) error {
	return ttyControl(f, func(fd int) error {
		return unix.IoctlSetWinsize(fd, unix.TIOCSWINSZ, &unix.Winsize{Col: cols, Row: rows})
	})
}

// getTermios reads a PTY's terminal settings (TCGETS on the master reads
// the terminal's, on Linux and gVisor alike).
func getTermios(f *os.File) (*unix.Termios, error) {
	var tio *unix.Termios
	err := ttyControl(f, func(fd int) error {
		var err error
		tio, err = unix.IoctlGetTermios(fd, unix.TCGETS)
		return err
	})
	return tio, err
}
