// Package client is the Go SDK for a Berth daemon: the control plane
// (create, list, kill sandboxes; templates; events) over the daemon's JSON
// REST API, and the data plane (processes, PTYs, files) over the in-sandbox
// agent's Connect protocol, proxied by the daemon under
// /v1/sandboxes/{id}/agent. It links nothing under internal/, so programs
// outside the module can depend on it.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"

	"github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/errdefs"
)

// DefaultURL is where the daemon listens unless BERTH_URL says otherwise.
const DefaultURL = "http://127.0.0.1:2378"

// DefaultUser is the user data-plane calls run as in a sandbox whose
// template names none (an image template's USER names one). A client calls
// as the sandbox's default user unless WithUser, ExecRequest.User or
// Sandbox.As say otherwise.
const DefaultUser = "root"

// DefaultSocket is the daemon's root-only local socket with the default
// data dir: on the daemon's host, root reaches it without a key.
const DefaultSocket = "/var/lib/berth/berth.sock"

// Client talks to one Berth daemon. It is safe for concurrent use.
type Client struct {
	base *url.URL
	hc   *http.Client
	user string
	// key is the API key sent on every request ("" sends none).
	key string
	// socket is the unix socket requests go through ("" for TCP).
	socket string
	// display is the URL as given, for messages.
	display string
}

// Option configures a Client.
type Option func(*Client)

// WithHTTPClient makes the Client use hc for every request. The client must
// not impose an overall timeout if streams (exec, events, builds) are used:
// bound calls with their context instead.
func WithHTTPClient(hc *http.Client) Option {
	return func(c *Client) { c.hc = hc }
}

// WithUser sets the default user that data-plane calls run as (default:
// the sandbox's, which is root unless its template names a USER).
// ExecRequest.User and Sandbox.As override it per call.
func WithUser(user string) Option {
	return func(c *Client) { c.user = user }
}

// WithAPIKey sends key on every request, in the X-API-Key header (data-plane
// calls use Authorization to name the user they act as).
func WithAPIKey(key string) Option {
	return func(c *Client) { c.key = key }
}

// New returns a Client for the daemon at baseURL: "http://127.0.0.1:2378",
// or "unix:///var/lib/berth/berth.sock" for the daemon's local socket.
func New(baseURL string, opts ...Option) (*Client, error) {
	u, err := url.Parse(strings.TrimRight(baseURL, "/"))
	if err != nil {
		return nil, fmt.Errorf("parse daemon url %q: %w", baseURL, err)
	}
	c := &Client{hc: &http.Client{}, display: baseURL}
	switch u.Scheme {
	case "http", "https":
		if u.Host == "" {
			return nil, fmt.Errorf("daemon url %q: no host: %w", baseURL, errdefs.ErrInvalidArgument)
		}
	case "unix":
		if u.Host != "" || u.Path == "" {
			return nil, fmt.Errorf("daemon url %q: want unix:///absolute/path/to/berth.sock: %w", baseURL, errdefs.ErrInvalidArgument)
		}
		// Requests name a placeholder host; the transport dials the
		// socket whatever the address.
		c.socket = u.Path
		u = &url.URL{Scheme: "http", Host: "berth"}
	default:
		return nil, fmt.Errorf("daemon url %q: scheme must be http, https or unix: %w", baseURL, errdefs.ErrInvalidArgument)
	}
	c.base = u
	for _, o := range opts {
		o(c)
	}
	if c.socket != "" || c.key != "" {
		hc := *c.hc
		base := hc.Transport
		if c.socket != "" {
			path := c.socket
			base = &http.Transport{
				DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
					var d net.Dialer
					return d.DialContext(ctx, "unix", path)
				},
			}
		}
		if base == nil {
			base = http.DefaultTransport
		}
		if c.key != "" {
			base = keyTransport{key: c.key, base: base}
		}
		hc.Transport = base
		c.hc = &hc
	}
	return c, nil
}

// keyTransport adds the API key to every request.
type keyTransport struct {
	key  string
	base http.RoundTripper
}

func (t keyTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	req.Header.Set("X-API-Key", t.key)
	return t.base.RoundTrip(req)
}

// FromEnv returns a Client for the daemon named by BERTH_URL, or DefaultURL,
// sending the API key in BERTH_API_KEY if set (options given win).
func FromEnv(opts ...Option) (*Client, error) {
	u := os.Getenv("BERTH_URL")
	if u == "" {
		u = DefaultURL
	}
	if k := os.Getenv("BERTH_API_KEY"); k != "" {
		opts = append([]Option{WithAPIKey(k)}, opts...)
	}
	return New(u, opts...)
}

// URL returns the daemon's base URL (for a unix socket, as given).
func (c *Client) URL() string {
	if c.socket != "" {
		return c.display
	}
	return c.base.String()
}

// endpoint joins the base URL with a path (already escaped by the caller)
// and query.
func (c *Client) endpoint(path string, q url.Values) string {
	s := c.base.String() + path
	if len(q) > 0 {
		s += "?" + q.Encode()
	}
	return s
}

// do sends a request with an optional JSON body and returns the response
// when the status is 2xx; otherwise it decodes the error body.
func (c *Client) do(ctx context.Context, method, path string, q url.Values, in any) (*http.Response, error) {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return nil, fmt.Errorf("encode %s %s: %w", method, path, err)
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.endpoint(path, q), body)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, c.unreachable(err)
	}
	if resp.StatusCode/100 != 2 {
		defer resp.Body.Close()
		return nil, decodeError(resp)
	}
	return resp, nil
}

// doJSON is do plus decoding a JSON answer into out (if out is non-nil).
func (c *Client) doJSON(ctx context.Context, method, path string, q url.Values, in, out any) error {
	resp, err := c.do(ctx, method, path, q, in)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("decode %s %s answer: %w", method, path, err)
	}
	return nil
}

// maxErrorBody bounds how much of an error body we read.
const maxErrorBody = 64 << 10

// decodeError turns a non-2xx answer into an *errdefs.Error. It reads the
// daemon's {"code": "<string>", "message", "field"}, the agent's envd-style
// {"code": <http status>, "message"}, and bodies that are neither (a proxy's
// page), classing those by the HTTP status.
func decodeError(resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	var w struct {
		Code    json.RawMessage `json:"code"`
		Message string          `json:"message"`
		Field   string          `json:"field"`
	}
	if err := json.Unmarshal(b, &w); err == nil {
		var code string
		if json.Unmarshal(w.Code, &code) == nil && code != "" {
			return wireError(&types.Error{Code: code, Message: w.Message, Field: w.Field})
		}
		if w.Message != "" {
			return wireError(&types.Error{Code: codeForStatus(resp.StatusCode), Message: w.Message, Field: w.Field})
		}
	}
	msg := strings.TrimSpace(string(b))
	if msg == "" {
		msg = resp.Status
	}
	return &errdefs.Error{Code: codeForStatus(resp.StatusCode), Message: msg}
}

// wireError is the daemon's error body as an error: an *errdefs.Error
// whose message is never empty.
func wireError(w *types.Error) *errdefs.Error {
	msg := w.Message
	if msg == "" {
		msg = w.Code
	}
	return &errdefs.Error{Code: w.Code, Message: msg, Field: w.Field}
}

// codeForStatus guesses the error code of an HTTP status without a body.
func codeForStatus(status int) string {
	switch status {
	case http.StatusNotFound:
		return errdefs.CodeNotFound
	case http.StatusConflict:
		return errdefs.CodeFailedPrecondition
	case http.StatusBadRequest:
		return errdefs.CodeInvalidArgument
	case http.StatusForbidden:
		return errdefs.CodePermissionDenied
	case http.StatusUnauthorized:
		return errdefs.CodeUnauthenticated
	case http.StatusTooManyRequests, http.StatusInsufficientStorage:
		return errdefs.CodeResourceExhausted
	case http.StatusServiceUnavailable, http.StatusBadGateway:
		return errdefs.CodeUnavailable
	case http.StatusGatewayTimeout:
		return errdefs.CodeDeadlineExceeded
	case http.StatusNotImplemented:
		return errdefs.CodeNotImplemented
	}
	return errdefs.CodeInternal
}

// ErrorCode returns the wire code of err: the code an *errdefs.Error
// carries, else the code of its class, else "internal".
func ErrorCode(err error) string {
	var e *errdefs.Error
	if errors.As(err, &e) && e.Code != "" {
		return e.Code
	}
	return errdefs.Code(err)
}

// unreachableError is a failure to talk to the daemon at all. It is of
// class errdefs.ErrUnavailable and keeps the transport error.
type unreachableError struct {
	url string
	err error
}

func (e *unreachableError) Error() string {
	return fmt.Sprintf("cannot reach the berth daemon at %s: %v", e.url, e.err)
}

func (e *unreachableError) Unwrap() []error { return []error{errdefs.ErrUnavailable, e.err} }

func (c *Client) unreachable(err error) error {
	// Cancellation is the caller's doing, not the daemon's absence.
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	// Drop the method and URL net/http repeats; the op error says enough.
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	return &unreachableError{url: c.URL(), err: err}
}
