package e2bcompat

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/auth"
	"github.com/berth-sandbox/berth/internal/core"
)

// KeyPrefix starts every API key: E2B's SDKs check keys against
// ^e2b_[0-9a-f]+$ before sending them.
const KeyPrefix = "e2b_"

// KeyStore persists API keys.
type KeyStore interface {
	PutAPIKey(ctx context.Context, k core.APIKey) error
	APIKeyByHash(ctx context.Context, hash string) (core.APIKey, error)
	ListAPIKeys(ctx context.Context) ([]core.APIKey, error)
	RevokeAPIKey(ctx context.Context, id string, at time.Time) error
	GetAPIKey(ctx context.Context, id string) (core.APIKey, error)
	SetAPIKeyQuota(ctx context.Context, id string, q core.Quota) error
}

// Keys issues, lists, revokes and verifies API keys.
type Keys struct {
	store KeyStore
}

// NewKeys returns Keys backed by st.
func NewKeys(st KeyStore) *Keys { return &Keys{store: st} }

// hashKey is how a key is stored and looked up (auth.HashKey).
func hashKey(secret string) string { return auth.HashKey(secret) }

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// Create issues a key named name and returns its record and its secret,
// which is not stored and cannot be shown again.
func (k *Keys) Create(ctx context.Context, name string) (core.APIKey, string, error) {
	return k.CreateWith(ctx, name, false, core.Quota{})
}

// CreateWith is Create for an admin key or one with a quota.
func (k *Keys) CreateWith(ctx context.Context, name string, admin bool, quota core.Quota) (core.APIKey, string, error) {
	if len(name) > 128 {
		return core.APIKey{}, "", fmt.Errorf("api key name is longer than 128 bytes: %w", errdefs.ErrInvalidArgument)
	}
	secret := KeyPrefix + randHex(20)
	rec := core.APIKey{
		ID:        "key" + randHex(6),
		Name:      name,
		Hash:      hashKey(secret),
		Mask:      KeyPrefix + "…" + secret[len(secret)-4:],
		CreatedAt: time.Now().UTC(),
		Admin:     admin,
		Quota:     quota,
	}
	if err := k.store.PutAPIKey(ctx, rec); err != nil {
		return core.APIKey{}, "", err
	}
	return rec, secret, nil
}

// List returns every key, revoked ones included.
func (k *Keys) List(ctx context.Context) ([]core.APIKey, error) { return k.store.ListAPIKeys(ctx) }

// Revoke stops a key from authenticating.
func (k *Keys) Revoke(ctx context.Context, id string) error {
	return k.store.RevokeAPIKey(ctx, id, time.Now().UTC())
}

// SetQuota replaces an active key's quota and returns the updated key. It
// takes effect on the key's next create.
func (k *Keys) SetQuota(ctx context.Context, id string, q core.Quota) (core.APIKey, error) {
	if err := k.store.SetAPIKeyQuota(ctx, id, q); err != nil {
		return core.APIKey{}, err
	}
	return k.store.GetAPIKey(ctx, id)
}

// Verify returns the active key whose secret is secret, or an error wrapping
// errdefs.ErrUnauthenticated.
func (k *Keys) Verify(ctx context.Context, secret string) (core.APIKey, error) {
	if secret == "" {
		return core.APIKey{}, fmt.Errorf("missing API key: send it as \"Authorization: Bearer KEY\" or in the X-API-Key header (create one with `berth apikey create`): %w", errdefs.ErrUnauthenticated)
	}
	if !strings.HasPrefix(secret, KeyPrefix) || len(secret) > 256 {
		return core.APIKey{}, fmt.Errorf("invalid API key: %w", errdefs.ErrUnauthenticated)
	}
	rec, err := k.store.APIKeyByHash(ctx, hashKey(secret))
	if errors.Is(err, errdefs.ErrNotFound) {
		return core.APIKey{}, fmt.Errorf("invalid or revoked API key: %w", errdefs.ErrUnauthenticated)
	}
	if err != nil {
		return core.APIKey{}, err
	}
	return rec, nil
}
