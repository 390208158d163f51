package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/berth-sandbox/berth/errdefs"
)

// maxBody bounds control-plane request bodies.
const maxBody = 1 << 20

// decodeJSON strictly decodes a request body into v: unknown fields, a
// second JSON value and oversized bodies are errors naming the problem. An
// empty body leaves v as it is.
func decodeJSON(r *http.Request, v any) error {
	body := http.MaxBytesReader(nil, r.Body, maxBody)
	data, err := io.ReadAll(body)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return badField("body", fmt.Errorf("request body is larger than %d bytes: %w", maxBody, errdefs.ErrInvalidArgument))
		}
		return badField("body", fmt.Errorf("read request body: %v: %w", err, errdefs.ErrInvalidArgument))
	}
	return decodeBytes(data, v)
}

func decodeBytes(data []byte, v any) error {
	if len(strings.TrimSpace(string(data))) == 0 {
		return nil
	}
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var ute *json.UnmarshalTypeError
		var se *json.SyntaxError
		switch {
		case errors.As(err, &ute):
			field := errdefs.JSONField(ute.Field)
			return badField(field, fmt.Errorf("%s: want %s, got JSON %s: %w", field, ute.Type, ute.Value, errdefs.ErrInvalidArgument))
		case errors.As(err, &se):
			return badField("body", fmt.Errorf("malformed JSON at byte %d: %v: %w", se.Offset, err, errdefs.ErrInvalidArgument))
		case strings.HasPrefix(err.Error(), "json: unknown field "):
			name := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
			return badField(name, fmt.Errorf("unknown field %q: %w", name, errdefs.ErrInvalidArgument))
		}
		return badField("body", fmt.Errorf("malformed JSON: %v: %w", err, errdefs.ErrInvalidArgument))
	}
	if dec.More() {
		return badField("body", fmt.Errorf("body holds more than one JSON value: %w", errdefs.ErrInvalidArgument))
	}
	return nil
}
