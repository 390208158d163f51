package main

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// blockingListener accepts with a blocking accept(2) on its own thread
// instead of Go's network poller. The poller registers the listening
// socket with epoll for good, and gVisor's sentry (runsc 2022) refuses
// to checkpoint a socket that has a waiter registered ("endpoint still
// has waiters upon save"), so a sandbox whose agent listened through the
// poller could never be paused with its memory. A task blocked in
// accept(2) is interrupted by the checkpoint and restarts the call after
// a restore. Accepted connections use the poller as usual: the daemon
// closes its connections to the agent before a checkpoint.
type blockingListener struct {
	fd     int
	addr   net.Addr
	mu     sync.Mutex
	closed bool
}

// listenBlocking listens on addr (host:port, host an IP literal).
func listenBlocking(addr string) (*blockingListener, error) {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return nil, fmt.Errorf("listen address %q: %w", addr, err)
	}
	family, sa := unix.AF_INET, unix.Sockaddr(&unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().Unmap().As4()})
	if ap.Addr().Is6() && !ap.Addr().Is4In6() {
		family, sa = unix.AF_INET6, &unix.SockaddrInet6{Port: int(ap.Port()), Addr: ap.Addr().As16()}
	}
	fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("socket: %w", err)
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("SO_REUSEADDR: %w", err)
	}
	if err := unix.Bind(fd, sa); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("bind %s: %w", addr, err)
	}
	if err := unix.Listen(fd, unix.SOMAXCONN); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("listen %s: %w", addr, err)
	}
	l := &blockingListener{fd: fd, addr: &net.TCPAddr{IP: ap.Addr().AsSlice(), Port: int(ap.Port())}}
	if got, err := unix.Getsockname(fd); err == nil {
		switch a := got.(type) {
		case *unix.SockaddrInet4:
			l.addr = &net.TCPAddr{IP: a.Addr[:], Port: a.Port}
		case *unix.SockaddrInet6:
			l.addr = &net.TCPAddr{IP: a.Addr[:], Port: a.Port}
		}
	}
	return l, nil
}

// Accept waits for a connection in accept(2).
func (l *blockingListener) Accept() (net.Conn, error) {
	for {
		nfd, _, err := unix.Accept4(l.fd, unix.SOCK_CLOEXEC)
		if err != nil {
			if l.isClosed() {
				return nil, net.ErrClosed
			}
			if errors.Is(err, unix.EINTR) || errors.Is(err, unix.ECONNABORTED) {
				continue
			}
			return nil, &net.OpError{Op: "accept", Net: "tcp", Addr: l.addr, Err: err}
		}
		f := os.NewFile(uintptr(nfd), "agent-conn")
		c, err := net.FileConn(f) // a duplicate, on the poller
		f.Close()
		if err != nil {
			return nil, err
		}
		return c, nil
	}
}

func (l *blockingListener) isClosed() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.closed
}

// Close wakes a blocked Accept (shutdown does; close alone does not) and
// closes the socket.
func (l *blockingListener) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	_ = unix.Shutdown(l.fd, unix.SHUT_RDWR)
	return unix.Close(l.fd)
}

// Addr is the address the listener is bound to.
func (l *blockingListener) Addr() net.Addr { return l.addr }
