// Package errdefs holds the error classes callers act on, and maps them to
// and from wire codes. Code anywhere wraps one of these classes with %w; the
// API edge turns the class into an HTTP status and a stable code string, and
// the Go SDK turns the code back into the same class so errors.Is works on
// both sides of the wire.
package errdefs

import (
	"context"
	"errors"
	"strings"
)

// The error classes. Wrap them: fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound).
var (
	ErrNotFound           = errors.New("not found")
	ErrAlreadyExists      = errors.New("already exists")
	ErrInvalidArgument    = errors.New("invalid argument")
	ErrFailedPrecondition = errors.New("failed precondition")
	ErrPolicyDenied       = errors.New("policy denied")
	ErrUnavailable        = errors.New("unavailable")
	ErrResourceExhausted  = errors.New("resource exhausted")
	ErrUnauthenticated    = errors.New("unauthenticated")
	ErrPermissionDenied   = errors.New("permission denied")
	ErrNotImplemented     = errors.New("not implemented")
	ErrDeadlineExceeded   = errors.New("deadline exceeded")
	// ErrCanceled is context.Canceled itself: a call its caller gave up
	// on (Ctrl-C on `berth exec`, a closed request) is the caller's doing,
	// not a bug in Berth.
	ErrCanceled = context.Canceled
)

// Stable wire codes, one per class; "internal" for anything unclassified.
const (
	CodeNotFound           = "not_found"
	CodeAlreadyExists      = "already_exists"
	CodeInvalidArgument    = "invalid_argument"
	CodeFailedPrecondition = "failed_precondition"
	CodePolicyDenied       = "policy_denied"
	CodeUnavailable        = "unavailable"
	CodeResourceExhausted  = "resource_exhausted"
	CodeUnauthenticated    = "unauthenticated"
	CodePermissionDenied   = "permission_denied"
	CodeNotImplemented     = "not_implemented"
	CodeDeadlineExceeded   = "deadline_exceeded"
	CodeCanceled           = "canceled"
	CodeInternal           = "internal"
)

// class ties an error class to its wire code and HTTP status. Statuses are
// plain numbers so this package (which the Manager imports) links no
// net/http.
type class struct {
	err    error
	code   string
	status int
}

// classes is read-only after package initialisation; it is a table, not state.
var classes = []class{
	{ErrNotFound, CodeNotFound, 404},
	{ErrAlreadyExists, CodeAlreadyExists, 409},
	{ErrInvalidArgument, CodeInvalidArgument, 400},
	{ErrFailedPrecondition, CodeFailedPrecondition, 409},
	{ErrPolicyDenied, CodePolicyDenied, 403},
	{ErrUnavailable, CodeUnavailable, 503},
	{ErrResourceExhausted, CodeResourceExhausted, 429},
	{ErrUnauthenticated, CodeUnauthenticated, 401},
	{ErrPermissionDenied, CodePermissionDenied, 403},
	{ErrNotImplemented, CodeNotImplemented, 501},
	{ErrDeadlineExceeded, CodeDeadlineExceeded, 504},
	// 499: the client closed the request (nginx's convention; net/http
	// has no name for it).
	{ErrCanceled, CodeCanceled, 499},
}

// classOf finds err's class. A context's deadline is ErrDeadlineExceeded's
// class too: a wait that ran out of time is not a bug.
func classOf(err error) (class, bool) {
	for _, c := range classes {
		if errors.Is(err, c.err) {
			return c, true
		}
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return classOf(ErrDeadlineExceeded)
	}
	return class{}, false
}

// Code returns the stable wire code of err's class, or "internal".
func Code(err error) string {
	if c, ok := classOf(err); ok {
		return c.code
	}
	return CodeInternal
}

// HTTPStatus returns the HTTP status for err's class, or 500.
func HTTPStatus(err error) int {
	if c, ok := classOf(err); ok {
		return c.status
	}
	return 500
}

// FromCode returns the class for a wire code, or nil for an unknown code.
func FromCode(code string) error {
	for _, c := range classes {
		if c.code == code {
			return c.err
		}
	}
	return nil
}

// Error is an error received over the wire: a code and a message. It
// unwraps to the matching class so errors.Is works on the client side.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	// Field names the request field at fault, when there is one.
	Field string `json:"field,omitempty"`
}

func (e *Error) Error() string { return e.Message }

// Unwrap returns the class of the code, if it is known.
func (e *Error) Unwrap() error { return FromCode(e.Code) }

// Body is err as an API answers it: its class's code, its message (an
// internal error's says so), and the field an *Error in its chain names.
func Body(err error) *Error {
	b := &Error{Code: Code(err), Message: err.Error()}
	var e *Error
	if errors.As(err, &e) {
		b.Field = e.Field
	}
	if b.Code == CodeInternal {
		b.Message = "internal error: " + b.Message
	}
	return b
}

// JSONField is the field a JSON decoding error names (the Field of a
// json.UnmarshalTypeError) as the API spells it: the decoder puts the Go
// names of embedded structs in the path ("CreateRequest.allow_sudo"), and
// no field of the API begins with an upper-case letter.
func JSONField(path string) string {
	parts := strings.Split(path, ".")
	out := parts[:0]
	for _, p := range parts {
		if p != "" && p[0] >= 'A' && p[0] <= 'Z' {
			continue
		}
		out = append(out, p)
	}
	return strings.Join(out, ".")
}
