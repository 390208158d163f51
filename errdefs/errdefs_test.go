package errdefs

import (
	"context"
	"errors"
	"fmt"
	"testing"
)

func TestRoundTrip(t *testing.T) {
	for _, c := range classes {
		wrapped := fmt.Errorf("sandbox x: %w", c.err)
		code := Code(wrapped)
		if code != c.code {
			t.Errorf("Code(%v) = %q, want %q", wrapped, code, c.code)
		}
		if got := HTTPStatus(wrapped); got != c.status {
			t.Errorf("HTTPStatus(%v) = %d, want %d", wrapped, got, c.status)
		}
		wire := &Error{Code: code, Message: wrapped.Error()}
		if !errors.Is(wire, c.err) {
			t.Errorf("wire error with code %q is not %v", code, c.err)
		}
	}
	if Code(errors.New("boom")) != CodeInternal || HTTPStatus(errors.New("boom")) != 500 {
		t.Error("an unclassified error is not internal/500")
	}
	if got := Code(fmt.Errorf("wait: %w", context.DeadlineExceeded)); got != CodeDeadlineExceeded {
		t.Errorf("Code(context deadline) = %q, want %q", got, CodeDeadlineExceeded)
	}
	if got := Code(fmt.Errorf("exec: %w", context.Canceled)); got != CodeCanceled {
		t.Errorf("Code(context canceled) = %q, want %q", got, CodeCanceled)
	}
	if FromCode("no_such_code") != nil {
		t.Error("FromCode(unknown) is not nil")
	}
}

func TestBody(t *testing.T) {
	for _, c := range []struct {
		err  error
		want Error
	}{
		{fmt.Errorf("sandbox x: %w", ErrNotFound), Error{Code: CodeNotFound, Message: "sandbox x: not found"}},
		{fmt.Errorf("create: %w", &Error{Code: CodeInvalidArgument, Field: "memory", Message: "memory: want bytes"}),
			Error{Code: CodeInvalidArgument, Field: "memory", Message: "create: memory: want bytes"}},
		{errors.New("disk on fire"), Error{Code: CodeInternal, Message: "internal error: disk on fire"}},
	} {
		if got := Body(c.err); *got != c.want {
			t.Errorf("Body(%v) = %+v, want %+v", c.err, *got, c.want)
		}
	}
}

func TestJSONField(t *testing.T) {
	for in, want := range map[string]string{
		"CreateRequest.allow_sudo": "allow_sudo",
		"network.allow":            "network.allow",
		"CreateRequest.network.X":  "network",
		"cpu":                      "cpu",
	} {
		if got := JSONField(in); got != want {
			t.Errorf("JSONField(%q) = %q, want %q", in, got, want)
		}
	}
}
