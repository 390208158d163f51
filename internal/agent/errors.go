package agent

import (
	"encoding/json"
	"errors"
	"net/http"
	"os"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"
)

// Error classes inside the agent. The agent links no host-side packages (it
// runs in untrusted sandboxes), so it keeps its own small set and maps it to
// Connect codes and HTTP statuses here, once.
var (
	errNotFound           = errors.New("not found")
	errInvalid            = errors.New("invalid argument")
	errExists             = errors.New("already exists")
	errPermission         = errors.New("permission denied")
	errFailedPrecondition = errors.New("failed precondition")
	errNoSpace            = errors.New("no space left on device")
	errResourceExhausted  = errors.New("resource exhausted")
)

func connectCode(err error) connect.Code {
	switch {
	case errors.Is(err, errNotFound), errors.Is(err, os.ErrNotExist), errors.Is(err, errUnknownUser):
		return connect.CodeNotFound
	case errors.Is(err, errInvalid), errors.Is(err, errBadPath), errors.Is(err, unix.ENOTDIR),
		errors.Is(err, unix.EISDIR), errors.Is(err, unix.ENAMETOOLONG), errors.Is(err, unix.EINVAL),
		errors.Is(err, unix.ENOTEMPTY), errors.Is(err, unix.ELOOP):
		return connect.CodeInvalidArgument
	case errors.Is(err, errExists), errors.Is(err, os.ErrExist):
		return connect.CodeAlreadyExists
	case errors.Is(err, errPermission), errors.Is(err, os.ErrPermission), errors.Is(err, unix.EROFS):
		return connect.CodePermissionDenied
	case errors.Is(err, errNoSpace), errors.Is(err, unix.ENOSPC), errors.Is(err, unix.EDQUOT), errors.Is(err, errResourceExhausted):
		return connect.CodeResourceExhausted
	case errors.Is(err, errFailedPrecondition):
		return connect.CodeFailedPrecondition
	}
	return connect.CodeInternal
}

// rpcErr converts err to a Connect error with its class's code.
func rpcErr(err error) error {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		return err
	}
	return connect.NewError(connectCode(err), err)
}

func httpStatus(err error) int {
	switch connectCode(err) {
	case connect.CodeNotFound:
		return http.StatusNotFound
	case connect.CodeInvalidArgument:
		return http.StatusBadRequest
	case connect.CodeAlreadyExists:
		return http.StatusConflict
	case connect.CodePermissionDenied:
		return http.StatusForbidden
	case connect.CodeResourceExhausted:
		return http.StatusInsufficientStorage
	}
	return http.StatusInternalServerError
}

// jsonError writes envd's error body: {"code": <status>, "message": "..."}.
func jsonError(w http.ResponseWriter, status int, err error) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}{status, err.Error()})
}
