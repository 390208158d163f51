package client

import (
	"context"
	"errors"
	"testing"

	"connectrpc.com/connect"

	"github.com/berth-sandbox/berth/errdefs"
)

// TestAgentErrorDeadline: the agent's deadline_exceeded (its end of the
// caller's Connect-Timeout-Ms passing first) reads as the caller's own
// context.DeadlineExceeded, and still as the API's code; other codes do
// not.
func TestAgentErrorDeadline(t *testing.T) {
	err := agentError(connect.NewError(connect.CodeDeadlineExceeded, errors.New("the request's deadline passed")))
	var e *errdefs.Error
	if !errors.Is(err, context.DeadlineExceeded) || !errors.As(err, &e) || e.Code != errdefs.CodeDeadlineExceeded {
		t.Errorf("agent's deadline_exceeded = %v, want context.DeadlineExceeded with code %s", err, errdefs.CodeDeadlineExceeded)
	}
	if err := agentError(connect.NewError(connect.CodeNotFound, errors.New("no such file"))); errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("not_found = %v", err)
	}
	if err := agentError(context.Canceled); !errors.Is(err, context.Canceled) {
		t.Errorf("a context error = %v, want it as is", err)
	}
}
