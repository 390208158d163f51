// Command berth is Berth's command-line tool: it runs the daemon (berth
// serve) and drives it as a client (create, exec, shell, cp, …). The
// client commands use only the public Go SDK in package client.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	// Interrupts are not caught for exec and shell: those forward or let
	// the terminal deliver them. The context ends on SIGTERM so streaming
	// commands unwind cleanly.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	code := run(ctx, os.Args[1:], streams{in: os.Stdin, out: os.Stdout, err: os.Stderr})
	stop()
	os.Exit(code)
}
