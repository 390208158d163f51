package client

import (
	"cmp"
	"fmt"
	"net/http"
	"net/url"
	"strconv"

	"github.com/berth-sandbox/berth/errdefs"
)

// PortTransport returns an http.RoundTripper that sends each request to
// the server listening on port in the sandbox (a web app the agent
// started, say), through the daemon's ports route
// (/v1/sandboxes/{id}/ports/{port}/…): the request's path and query are
// the server's, and its host goes on as X-Forwarded-Host, which the
// server sees as its Host. The API key goes to the daemon as on every
// call, never to the server. Answers come back as the server gave them;
// one the daemon gives instead (nothing listens on the port: 502) is a
// JSON error.
//
//	hc := &http.Client{Transport: sb.PortTransport(8080)}
//	resp, err := hc.Get("http://app.local/health")
func (s *Sandbox) PortTransport(port int) http.RoundTripper {
	return portTransport{s: s, port: port}
}

type portTransport struct {
	s    *Sandbox
	port int
}

func (t portTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	// A RoundTripper closes the request's body, whatever happens.
	fail := func(err error) (*http.Response, error) {
		if req.Body != nil {
			_ = req.Body.Close()
		}
		return nil, err
	}
	c, err := t.s.client()
	if err != nil {
		return fail(err)
	}
	if t.port < 1 || t.port > 65535 {
		return fail(&errdefs.Error{Code: errdefs.CodeInvalidArgument, Field: "port", Message: fmt.Sprintf("port %d: want 1 to 65535", t.port)})
	}
	path := req.URL.EscapedPath()
	if path == "" {
		path = "/"
	}
	u, err := url.Parse(c.endpoint(sandboxPath(t.s.ID)+"/ports/"+strconv.Itoa(t.port)+path, nil))
	if err != nil {
		return fail(err)
	}
	u.RawQuery = req.URL.RawQuery
	out := req.Clone(req.Context())
	out.URL, out.Host, out.RequestURI = u, "", ""
	if host := cmp.Or(req.Host, req.URL.Host); host != "" {
		out.Header.Set("X-Forwarded-Host", host)
	}
	rt := c.hc.Transport
	if rt == nil {
		rt = http.DefaultTransport
	}
	return rt.RoundTrip(out)
}
