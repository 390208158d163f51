package client

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"mime"
	"net/http"

	"connectrpc.com/connect"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/proto/filesystem/filesystemconnect"
	"github.com/berth-sandbox/berth/proto/process/processconnect"
)

// keepaliveSeconds asks the agent for a keepalive event on quiet streams so
// proxies between us and it don't cut an idle but live command.
const keepaliveSeconds = "50"

// agentBase is the URL the daemon proxies to a sandbox's agent.
func (c *Client) agentBase(id string) string {
	return c.base.String() + sandboxPath(id) + "/agent"
}

// agentHTTP is the HTTP client for Connect calls through the daemon. A
// failure the daemon itself answers (unknown sandbox, agent down) comes back
// as our JSON error, which Connect would misread for streaming calls (404
// becomes "unimplemented"); it is decoded here instead and returned as the
// transport error, which Connect wraps and errors.As finds. Failing to reach
// the daemon reads the same as on the control plane.
type agentHTTP struct{ c *Client }

func (a agentHTTP) Do(req *http.Request) (*http.Response, error) {
	resp, err := a.c.hc.Do(req)
	if err != nil {
		return nil, a.c.unreachable(err)
	}
	if resp.StatusCode < 400 {
		return resp, nil
	}
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if mt != "application/json" {
		return resp, nil
	}
	defer resp.Body.Close()
	return nil, decodeError(resp)
}

func (s *Sandbox) processClient() (processconnect.ProcessClient, error) {
	c, err := s.client()
	if err != nil {
		return nil, err
	}
	return processconnect.NewProcessClient(agentHTTP{c}, c.agentBase(s.ID)), nil
}

func (s *Sandbox) filesystemClient() (filesystemconnect.FilesystemClient, error) {
	c, err := s.client()
	if err != nil {
		return nil, err
	}
	return filesystemconnect.NewFilesystemClient(agentHTTP{c}, c.agentBase(s.ID)), nil
}

// userOr returns user, or the handle's user when it is empty.
func (s *Sandbox) userOr(user string) string {
	if user != "" {
		return user
	}
	// "" names no user: the agent acts as the sandbox's default user.
	return s.user
}

// basicUser is the Authorization value naming the user a call acts as: the
// envd convention of HTTP Basic with the user name and an empty password.
func basicUser(user string) string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"))
}

// setHeaders names the user and asks for keepalives on a Connect request.
func setHeaders(h http.Header, user string) {
	h.Set("Authorization", basicUser(user))
	h.Set("Keepalive-Ping-Interval", keepaliveSeconds)
}

// agentError turns an error from a Connect call into an *errdefs.Error so
// callers classify data-plane failures with errors.Is like control-plane
// ones. Context errors pass through untouched, and the agent's
// deadline_exceeded is context.DeadlineExceeded too.
func agentError(err error) error {
	if err == nil {
		return nil
	}
	var e *errdefs.Error
	if errors.As(err, &e) {
		return e
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		e := &errdefs.Error{Code: codeForConnect(ce.Code()), Message: ce.Message()}
		if ce.Code() == connect.CodeDeadlineExceeded {
			// The agent's word that the request's deadline passed: that
			// deadline is the caller's ctx's (sent as Connect-Timeout-Ms),
			// which may pass on the agent's clock a moment before ours.
			return fmt.Errorf("%w: %w", e, context.DeadlineExceeded)
		}
		return e
	}
	return fmt.Errorf("%w: %w", errdefs.ErrUnavailable, err)
}

func codeForConnect(c connect.Code) string {
	switch c {
	case connect.CodeNotFound:
		return errdefs.CodeNotFound
	case connect.CodeAlreadyExists:
		return errdefs.CodeAlreadyExists
	case connect.CodeInvalidArgument, connect.CodeOutOfRange:
		return errdefs.CodeInvalidArgument
	case connect.CodeFailedPrecondition, connect.CodeAborted:
		return errdefs.CodeFailedPrecondition
	case connect.CodePermissionDenied:
		return errdefs.CodePermissionDenied
	case connect.CodeUnauthenticated:
		return errdefs.CodeUnauthenticated
	case connect.CodeResourceExhausted:
		return errdefs.CodeResourceExhausted
	case connect.CodeUnavailable:
		return errdefs.CodeUnavailable
	case connect.CodeDeadlineExceeded:
		return errdefs.CodeDeadlineExceeded
	case connect.CodeUnimplemented:
		return errdefs.CodeNotImplemented
	case connect.CodeCanceled:
		return errdefs.CodeCanceled
	}
	return errdefs.CodeInternal
}
