package agentlink

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestStartBackground(t *testing.T) {
	addr, dir := startAgent(t)
	l := New()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// A process that ends: the watch reports how, with its output.
	bg, err := l.Start(ctx, addr, testToken, Command{Argv: []string{"/bin/sh", "-c", "echo starting; echo oops >&2; exit 3"}})
	if err != nil {
		t.Fatal(err)
	}
	<-bg.Ended()
	res, ok := bg.Result()
	if !ok || res.ExitCode != 3 || !strings.Contains(bg.Tail(), "starting") || !strings.Contains(bg.Tail(), "oops") {
		t.Errorf("Result = %+v, %v; tail %q", res, ok, bg.Tail())
	}
	bg.Close()

	// A process outlives both its watch and a ctx with a deadline (the
	// agent kills processes whose stream carried one when it passes).
	short, cancelShort := context.WithTimeout(ctx, 20*time.Second)
	fifo := filepath.Join(dir, "fifo")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	bg, err = l.Start(short, addr, testToken, Command{Argv: []string{"/bin/sh", "-c", "cat " + fifo}})
	if err != nil {
		t.Fatal(err)
	}
	pid := int(bg.Pid)
	bg.Close()
	cancelShort()
	if _, ok := bg.Result(); ok {
		t.Fatal("the process ended with its watch")
	}
	if err := unix.Kill(pid, 0); err != nil {
		t.Fatalf("background process %d gone after Close: %v", pid, err)
	}
	// Let it end: open the fifo for writing and close it.
	f, err := os.OpenFile(fifo, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()

	if _, err := l.Start(ctx, addr, testToken, Command{}); err == nil {
		t.Error("Start with an empty command succeeded")
	}
}

func TestReadyProbes(t *testing.T) {
	addr, dir := startAgent(t)
	l := New()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// The agent here runs on the host: it reads the host's /proc/net/tcp.
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	if ok, err := l.Listening(ctx, addr, testToken, port); !ok || err != nil {
		t.Errorf("Listening(%d) = %v, %v with a listener", port, ok, err)
	}
	ln.Close()
	if ok, err := l.Listening(ctx, addr, testToken, port); ok || err != nil {
		t.Errorf("Listening(%d) = %v, %v after close", port, ok, err)
	}

	p := filepath.Join(dir, "ready")
	if ok, err := l.Exists(ctx, addr, testToken, p); ok || err != nil {
		t.Errorf("Exists(missing) = %v, %v", ok, err)
	}
	if err := os.WriteFile(p, []byte("yes"), 0o644); err != nil {
		t.Fatal(err)
	}
	if ok, err := l.Exists(ctx, addr, testToken, p); !ok || err != nil {
		t.Errorf("Exists(present) = %v, %v", ok, err)
	}
}

func TestListensOn(t *testing.T) {
	table := `  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0000000000000000 100 0 0 10 0
   1: 0100007F:0050 0100007F:C350 01 00000000:00000000 00:00000000 00000000     0        0 2 1 0000000000000000 100 0 0 10 0
`
	for port, want := range map[int]bool{8080: true, 80: false, 443: false} {
		if got := ListensOn([]byte(table), port); got != want {
			t.Errorf("ListensOn(%d) = %v, want %v", port, got, want)
		}
	}
	if ListensOn([]byte("garbage\n0: x 0A\n"), 0) {
		t.Error("garbage listens")
	}
}
