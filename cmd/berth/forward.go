package main

import (
	"context"
	"fmt"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/errdefs"
)

// newForwardCmd is `berth forward ID PORT`: a local HTTP listener whose
// every request goes to the server on PORT in the sandbox, through the
// daemon's ports route (so it works wherever the API does, a Kubernetes
// gateway included, and the sandbox needs no published port).
func newForwardCmd(a *app) *cobra.Command {
	var listen string
	cmd := &cobra.Command{
		Use:   "forward ID PORT",
		Short: "Serve a sandbox's HTTP port on a local address until interrupted",
		Long: "Forward HTTP (WebSockets included) from a local address to the server listening on PORT " +
			"in the sandbox, through the API: open the printed URL in a browser to see a web app the " +
			"agent started. The server sees the local Host. Ends on Ctrl-C, or when the sandbox ends.",
		Args: exactArgs(2, "a sandbox ID and a port"),
		RunE: func(cmd *cobra.Command, args []string) error {
			port, err := strconv.Atoi(args[1])
			if err != nil || port < 1 || port > 65535 {
				return invalidf("port %q: want a number from 1 to 65535", args[1])
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
			ln, err := net.Listen("tcp", listen)
			if err != nil {
				return invalidf("--listen %q: %v", listen, err)
			}
			sb := c.Sandbox(args[0])
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
			fmt.Fprintf(a.out, "forwarding http://%s to port %d of sandbox %s (Ctrl-C ends)\n", ln.Addr(), port, args[0])
			done := make(chan error, 1)
			go func() { done <- srv.Serve(ln) }()
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
			_ = srv.Shutdown(sctx)
			return endErr
		},
	}
	cmd.Flags().StringVar(&listen, "listen", "127.0.0.1:0", "local address to serve on (port 0: any free one, printed)")
	return cmd
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
