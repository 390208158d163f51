package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/splice"
)

// newForwardCmd is `berth forward ID PORT`: a local HTTP listener whose
// every request goes to the server on PORT in the sandbox, through the
// daemon's ports route (so it works wherever the API does, a Kubernetes
// gateway included, and the sandbox needs no published port); with --tcp,
// a local TCP listener whose every connection is a port tunnel; with
// --udp, a local UDP socket whose every peer gets a UDP tunnel.
func newForwardCmd(a *app) *cobra.Command {
	var (
		listen   string
		tcp, udp bool
	)
	cmd := &cobra.Command{
		Use:   "forward ID PORT [--tcp|--udp] [--listen ADDR]",
		Short: "Serve a sandbox's port on a local address until interrupted",
		Long: "Forward HTTP (WebSockets included) from a local address to the server listening on PORT " +
			"in the sandbox, through the API: open the printed URL in a browser to see a web app the " +
			"agent started. The server sees the local Host. With --tcp, forward any TCP connection " +
			"(a database, a debugger, ssh) through a port tunnel instead, as ssh -L or kubectl " +
			"port-forward do; half-closes pass on. With --udp, forward UDP datagrams (a DNS server, " +
			"a game server): each local peer gets a tunnel of its own, closed after 2 minutes without " +
			"a datagram. Ends on Ctrl-C, or when the sandbox ends.",
		Args: exactArgs(2, "a sandbox ID and a port"),
		RunE: func(cmd *cobra.Command, args []string) error {
			port, err := strconv.Atoi(args[1])
			if err != nil || port < 1 || port > 65535 {
				return invalidf("port %q: want a number from 1 to 65535", args[1])
			}
			if tcp && udp {
				return invalidf("--tcp and --udp: want one of them")
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			// A sandbox that is not there fails here, not on the first
			// request.
			if _, err := c.Get(ctx, args[0]); err != nil {
				return err
			}
			sb := c.Sandbox(args[0])
			var serve func() error
			var shutdown func(context.Context) error
			var ln net.Listener
			if udp {
				pc, err := net.ListenPacket("udp", listen)
				if err != nil {
					return invalidf("--listen %q: %v", listen, err)
				}
				defer pc.Close()
				fctx, stop := context.WithCancel(ctx)
				defer stop()
				serve = func() error { return sb.ForwardUDP(fctx, pc, port, 0) }
				shutdown = func(context.Context) error { stop(); return nil }
				fmt.Fprintf(a.out, "forwarding udp://%s to port %d of sandbox %s (Ctrl-C ends)\n", pc.LocalAddr(), port, args[0])
			} else if ln, err = net.Listen("tcp", listen); err != nil {
				return invalidf("--listen %q: %v", listen, err)
			}
			switch {
			case udp:
			case tcp:
				fw := &tcpForwarder{ln: ln, sb: sb, port: port, errOut: a.err}
				serve, shutdown = fw.serve, fw.shutdown
				fmt.Fprintf(a.out, "forwarding tcp://%s to port %d of sandbox %s (Ctrl-C ends)\n", ln.Addr(), port, args[0])
			default:
				proxy := &httputil.ReverseProxy{
					Rewrite: func(pr *httputil.ProxyRequest) {
						pr.Out.URL.Scheme, pr.Out.URL.Host = "http", pr.In.Host
						pr.Out.Host = pr.In.Host
					},
					Transport:     sb.PortTransport(port),
					FlushInterval: -1,
					ErrorLog:      log.New(a.err, "berth forward: ", 0),
				}
				srv := &http.Server{Handler: proxy, ReadHeaderTimeout: 30 * time.Second}
				serve, shutdown = func() error { return srv.Serve(ln) }, srv.Shutdown
				fmt.Fprintf(a.out, "forwarding http://%s to port %d of sandbox %s (Ctrl-C ends)\n", ln.Addr(), port, args[0])
			}
			done := make(chan error, 1)
			go func() { done <- serve() }()
			// Ends with the command's context (Ctrl-C), or once the
			// sandbox has ended.
			ended := make(chan error, 1)
			go func() { ended <- waitEnded(ctx, c, args[0]) }()
			var endErr error
			select {
			case <-ctx.Done():
			case endErr = <-ended:
			case err := <-done:
				return err
			}
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			_ = shutdown(sctx)
			return endErr
		},
	}
	cmd.Flags().StringVar(&listen, "listen", "127.0.0.1:0", "local address to serve on (port 0: any free one, printed)")
	cmd.Flags().BoolVar(&tcp, "tcp", false, "forward TCP connections (any protocol) through port tunnels instead of HTTP requests")
	cmd.Flags().BoolVar(&udp, "udp", false, "forward UDP datagrams through UDP port tunnels, a tunnel per local peer")
	return cmd
}

// tcpForwarder is `berth forward --tcp`: each connection accepted on ln
// is spliced to a port tunnel into the sandbox. A tunnel that cannot be
// opened (nothing listens on the port) closes that connection and is
// reported; the listener goes on.
type tcpForwarder struct {
	ln     net.Listener
	sb     *client.Sandbox
	port   int
	errOut io.Writer

	mu    sync.Mutex
	conns map[io.Closer]struct{}
	wg    sync.WaitGroup
}

func (f *tcpForwarder) serve() error {
	for {
		local, err := f.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		f.track(local, true)
		f.wg.Go(func() {
			defer f.track(local, false)
			defer local.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			remote, err := f.sb.DialPort(ctx, f.port)
			cancel()
			if err != nil {
				fmt.Fprintf(f.errOut, "berth forward: %v\n", err)
				return
			}
			defer remote.Close()
			f.track(remote, true)
			defer f.track(remote, false)
			splice.Conns(local, remote)
		})
	}
}

// track adds c to, or removes it from, the connections shutdown closes.
func (f *tcpForwarder) track(c io.Closer, add bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.conns == nil {
		f.conns = map[io.Closer]struct{}{}
	}
	if add {
		f.conns[c] = struct{}{}
	} else {
		delete(f.conns, c)
	}
}

// shutdown stops accepting and closes every connection.
func (f *tcpForwarder) shutdown(context.Context) error {
	err := f.ln.Close()
	f.mu.Lock()
	for c := range f.conns {
		_ = c.Close()
	}
	f.mu.Unlock()
	f.wg.Wait()
	return err
}

// waitEnded follows the sandbox's events until it is destroyed (an
// error saying so) or ctx ends (nil).
func waitEnded(ctx context.Context, c *client.Client, id string) error {
	err := c.FollowEvents(ctx, id, func(client.Event) error { return nil })
	switch {
	case ctx.Err() != nil:
		return nil
	case err == nil:
		return fmt.Errorf("sandbox %s ended: %w", id, errdefs.ErrFailedPrecondition)
	}
	return err
}
