// Package auth decides who a request to the daemon is: the host's operator
// (the root-only unix socket, or any caller of a daemon that requires no
// key and got none) or the holder of an API key, which sees and touches only
// the sandboxes it created unless it is an admin key. Both the native API
// and the E2B-compatible API authenticate through it, so a key means the
// same on both.
package auth

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strings"

	"github.com/berth-sandbox/berth/internal/core"
)

// Principal is the authenticated caller of one request.
type Principal struct {
	// Key is the caller's API key; zero for the operator.
	Key core.APIKey
	// Operator is the host's operator: a caller on the root-only socket,
	// or a caller without a key on a daemon that does not require one.
	Operator bool
}

// Admin reports whether the caller sees and manages everything.
func (p Principal) Admin() bool { return p.Operator || p.Key.Admin }

// Owner is what a sandbox the caller creates records as its owner: the
// key's ID, or "" for the operator.
func (p Principal) Owner() string { return p.Key.ID }

// Sees reports whether the caller may see and touch a sandbox owned by
// owner. A key sees only its own; sandboxes without an owner are the
// operator's.
func (p Principal) Sees(owner string) bool {
	return p.Admin() || (p.Key.ID != "" && owner == p.Key.ID)
}

type principalKey struct{}

// With returns ctx carrying p.
func With(ctx context.Context, p Principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

// From returns the principal ctx carries.
func From(ctx context.Context) (Principal, bool) {
	p, ok := ctx.Value(principalKey{}).(Principal)
	return p, ok
}

type localKey struct{}

// MarkLocal marks a connection's context as coming through the root-only
// unix socket: its file mode is the authentication (http.Server.ConnContext).
func MarkLocal(ctx context.Context) context.Context {
	return context.WithValue(ctx, localKey{}, true)
}

// IsLocal reports whether ctx's connection came through the local socket.
func IsLocal(ctx context.Context) bool {
	v, _ := ctx.Value(localKey{}).(bool)
	return v
}

// Secret returns the API key a request carries: "Authorization: Bearer KEY"
// or E2B's "X-API-Key: KEY".
func Secret(r *http.Request) string {
	if k := r.Header.Get("X-API-Key"); k != "" {
		return k
	}
	h := r.Header.Get("Authorization")
	if len(h) > 7 && strings.EqualFold(h[:7], "bearer ") {
		return strings.TrimSpace(h[7:])
	}
	return ""
}

// Verifier checks an API key's secret.
type Verifier interface {
	Verify(ctx context.Context, secret string) (core.APIKey, error)
}

// Identify returns the caller of r. required says whether a caller without
// a key (and not on the local socket) is refused; otherwise it is the
// operator. A key that is sent is always checked.
func Identify(r *http.Request, v Verifier, required bool) (Principal, error) {
	if IsLocal(r.Context()) {
		return Principal{Operator: true}, nil
	}
	secret := Secret(r)
	if secret == "" && !required {
		return Principal{Operator: true}, nil
	}
	k, err := v.Verify(r.Context(), secret)
	if err != nil {
		return Principal{}, err
	}
	return Principal{Key: k}, nil
}

// HashKey is how an API key's secret is stored and looked up: its hex
// sha256. Keys are 160 random bits, so no slow hash is needed, and a
// lookup by hash compares no secret byte by byte.
func HashKey(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:])
}
