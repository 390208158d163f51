package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/sandbox"
)

// errorBody is the JSON body of every error answer.
type errorBody = errdefs.Error

// fieldError is a bad request field found at the API edge.
type fieldError struct {
	field string
	err   error
}

func (e *fieldError) Error() string { return e.err.Error() }
func (e *fieldError) Unwrap() error { return e.err }

func badField(field string, err error) error { return &fieldError{field: field, err: err} }

// boolParam reads query parameter name as true ("true", "1") or false
// (absent, "false", "0"); anything else is a bad field naming it.
func boolParam(q url.Values, name string) (bool, error) {
	switch v := q.Get(name); v {
	case "", "false", "0":
		return false, nil
	case "true", "1":
		return true, nil
	default:
		return false, badField(name, fmt.Errorf("%s %q: want true or false: %w", name, v, errdefs.ErrInvalidArgument))
	}
}

// timeParam reads query parameter name as an RFC 3339 time (the zero
// time when absent); anything else is a bad field naming it.
func timeParam(q url.Values, name string) (time.Time, error) {
	v := q.Get(name)
	if v == "" {
		return time.Time{}, nil
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return time.Time{}, badField(name, fmt.Errorf("%s %q: want an RFC 3339 time: %w", name, v, errdefs.ErrInvalidArgument))
	}
	return t, nil
}

// writeError maps an error to its status and JSON body: the one place where
// error classes become wire codes.
func writeError(w http.ResponseWriter, err error) {
	body := errorBody{Code: errdefs.Code(err), Message: err.Error()}
	var fe *fieldError
	var sfe *sandbox.FieldError
	switch {
	case errors.As(err, &fe):
		body.Field = fe.field
	case errors.As(err, &sfe):
		body.Field = sfe.Field
	}
	if body.Code == errdefs.CodeInternal {
		// Internal errors keep their text: an operator on a single host
		// needs it, and it never carries secrets.
		body.Message = "internal error: " + err.Error()
	}
	writeJSON(w, errdefs.HTTPStatus(err), body)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v) // the client went away: nobody to tell
}
