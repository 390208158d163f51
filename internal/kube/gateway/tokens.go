package gateway

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	apitypes "github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/e2bwire"
	"github.com/berth-sandbox/berth/proto/envd"
)

// An E2B sandbox's envdAccessToken is derived from its sandbox ID with a
// key every replica shares, the Secret TokenKeySecret in the gateway's
// namespace (made by the first replica that finds none). So any replica
// can hand the token out again (E2B's connect) and check a URL signed
// with it, while the pods keep only its hash: reading pods gives no
// token, and the key stays in a Secret.
//
// Rotation: the Secret's tokenKeyField is the current key, which new
// sandboxes' tokens are derived from; every data key that starts with
// retiredKeyPrefix holds a retired one, still used for the sandboxes
// made under it (the one whose token matches a pod's hash is that pod's).
// Replicas read the Secret again every tokenKeyReload, so a rotation
// (the Secret replaced with a new current key and the old one retired)
// reaches them all without a restart; a sandbox whose key is dropped
// from the Secret keeps the token its create returned, but connect no
// longer hands it out and URLs signed with it are refused.

// TokenKeySecret names the Secret holding the keys.
const TokenKeySecret = "berth-gateway-e2b"

const tokenKeyField = "envd-token-key"

// retiredKeyPrefix starts the data keys of retired keys
// ("envd-token-key-retired-2026-12", say).
const retiredKeyPrefix = "envd-token-key-retired"

// tokenKeyLen is a key's length in bytes (at least).
const tokenKeyLen = 32

// tokenKeyReload is how often a replica reads the keys again.
const tokenKeyReload = 30 * time.Second

// tokenKeys are the keys in use: the current one first, then the
// retired ones (by data key).
type tokenKeys [][]byte

// loadTokenKey reads the shared keys, making their Secret when there is
// none (two replicas racing read the one that was made first).
func (g *Gateway) loadTokenKey(ctx context.Context) error {
	secrets := g.cfg.Kube.CoreV1().Secrets(g.cfg.Namespace)
	for range 3 {
		s, err := secrets.Get(ctx, TokenKeySecret, metav1.GetOptions{})
		if err == nil {
			return g.useTokenKeys(s)
		}
		if !apierrors.IsNotFound(err) {
			return kubeErr("read the E2B token key (secret "+TokenKeySecret+")", err)
		}
		key := make([]byte, tokenKeyLen)
		rand.Read(key)
		immutable := true
		made, err := secrets.Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: TokenKeySecret, Labels: map[string]string{LabelManagedBy: ManagedBy}},
			Immutable:  &immutable,
			Data:       map[string][]byte{tokenKeyField: key},
		}, metav1.CreateOptions{})
		switch {
		case err == nil:
			g.log.Info("gateway_token_key_made", "secret", g.cfg.Namespace+"/"+TokenKeySecret)
			return g.useTokenKeys(made)
		case !apierrors.IsAlreadyExists(err):
			return kubeErr("make the E2B token key (secret "+TokenKeySecret+")", err)
		}
	}
	return fmt.Errorf("secret %s/%s: made and gone again: %w", g.cfg.Namespace, TokenKeySecret, errdefs.ErrUnavailable)
}

// useTokenKeys takes the keys of Secret s, or refuses them all (changing
// nothing) when one is too short.
func (g *Gateway) useTokenKeys(s *corev1.Secret) error {
	bad := func(field string, n int) error {
		return fmt.Errorf("secret %s/%s: %s holds %d bytes, want at least %d: %w", g.cfg.Namespace, TokenKeySecret, field, n, tokenKeyLen, errdefs.ErrFailedPrecondition)
	}
	cur := s.Data[tokenKeyField]
	if len(cur) < tokenKeyLen {
		return bad(tokenKeyField, len(cur))
	}
	keys := tokenKeys{cur}
	for _, field := range slices.Sorted(maps.Keys(s.Data)) {
		if !strings.HasPrefix(field, retiredKeyPrefix) {
			continue
		}
		if len(s.Data[field]) < tokenKeyLen {
			return bad(field, len(s.Data[field]))
		}
		keys = append(keys, s.Data[field])
	}
	g.keyMu.Lock()
	changed := len(g.tokenKeys) > 0 && !slices.EqualFunc(g.tokenKeys, keys, bytes.Equal)
	g.tokenKeys = keys
	g.keyMu.Unlock()
	if changed {
		g.log.Info("gateway_token_keys_changed", "secret", g.cfg.Namespace+"/"+TokenKeySecret, "retired", len(keys)-1)
	}
	return nil
}

// reloadTokenKeys reads the keys again every tokenKeyReload until ctx
// ends. A Secret that is gone or unreadable meanwhile (being replaced)
// leaves the keys as they were; only a replica's start makes one.
func (g *Gateway) reloadTokenKeys(ctx context.Context) {
	t := time.NewTicker(tokenKeyReload)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := g.readTokenKeys(ctx); err != nil && ctx.Err() == nil {
			g.log.Warn("gateway_token_keys_unread", "secret", g.cfg.Namespace+"/"+TokenKeySecret, "err", err)
		}
	}
}

// readTokenKeys reads the keys again; an error leaves them as they were.
func (g *Gateway) readTokenKeys(ctx context.Context) error {
	s, err := g.cfg.Kube.CoreV1().Secrets(g.cfg.Namespace).Get(ctx, TokenKeySecret, metav1.GetOptions{})
	if err != nil {
		return kubeErr("read the E2B token keys (secret "+TokenKeySecret+")", err)
	}
	return g.useTokenKeys(s)
}

// keys returns the keys in use, the current one first.
func (g *Gateway) keys() tokenKeys {
	g.keyMu.Lock()
	defer g.keyMu.Unlock()
	return g.tokenKeys
}

// envdToken is the envdAccessToken of a new E2B sandbox id (the current
// key's).
func (g *Gateway) envdToken(id string) string { return derive(g.keys()[0], envdPurpose, id) }

// trafficToken is the trafficAccessToken of a new E2B sandbox id (one
// made with allowPublicTraffic: false).
func (g *Gateway) trafficToken(id string) string { return derive(g.keys()[0], trafficPurpose, id) }

const (
	envdPurpose    = "berth e2b envd access token"
	trafficPurpose = "berth e2b traffic access token"
)

// derive is the token of purpose for sandbox id under key: 40 hex digits
// of an HMAC-SHA256.
func derive(key []byte, purpose, id string) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(purpose + "\x00" + id))
	return hex.EncodeToString(m.Sum(nil)[:20])
}

// tokenFor is the token of purpose of sandbox id whose sha256 is hash,
// derived under the key that made it (the current one or a retired
// one); false when no key in use did. Every key is tried, so the time it
// takes tells nothing of which.
func (g *Gateway) tokenFor(purpose, id, hash string) (string, bool) {
	found, ok := "", false
	for _, key := range g.keys() {
		if tok := derive(key, purpose, id); hashMatches(hash, tok) && !ok {
			found, ok = tok, true
		}
	}
	return found, ok
}

// tokenHash is what a pod keeps of its token (AnnotationEnvdTokenSHA256).
func tokenHash(token string) string {
	h := sha256.Sum256([]byte(token))
	return hex.EncodeToString(h[:])
}

// podToken is the envdAccessToken of an E2B sandbox's pod, when the pod's
// hash is that of a token derived under a key in use (a sandbox made
// under a key since dropped, or before tokens were derived, has none the
// gateway can tell).
func (g *Gateway) podToken(pod *corev1.Pod) (string, bool) {
	return g.tokenFor(envdPurpose, sandboxID(pod), pod.Annotations[AnnotationEnvdTokenSHA256])
}

// tokenMatches reports whether tok is the envd token whose hash the pod
// keeps.
func tokenMatches(pod *corev1.Pod, tok string) bool {
	return hashMatches(pod.Annotations[AnnotationEnvdTokenSHA256], tok)
}

// hashMatches reports whether tok is a non-empty token whose sha256 is
// the hex hash, in constant time.
func hashMatches(hash, tok string) bool {
	want, err := hex.DecodeString(hash)
	got := sha256.Sum256([]byte(tok))
	return err == nil && tok != "" && len(want) == len(got) && subtle.ConstantTimeCompare(got[:], want) == 1
}

// fileSig is a /files request's URL signature, as the E2B SDKs'
// uploadUrl and downloadUrl make it.
type fileSig struct {
	sig, path, op, user string
	exp                 int64
}

// readFileSig reads r's signature: ok when r is a /files request (GET
// and HEAD read, POST writes) carrying one, well formed and unexpired on
// the gateway's clock.
func (g *Gateway) readFileSig(r *http.Request) (fileSig, bool) {
	q := r.URL.Query()
	s := fileSig{sig: q.Get("signature"), path: q.Get("path"), user: q.Get("username")}
	if r.URL.Path != "/files" || s.sig == "" {
		return s, false
	}
	var err error
	s.op, s.exp, err = e2bwire.SignedFiles(r)
	return s, s.op != "" && err == nil && (s.exp == 0 || s.exp >= g.now().Unix())
}

// madeFor reports whether the signature was made with the pod's token.
func (g *Gateway) madeFor(s fileSig, pod *corev1.Pod) bool {
	tok, ok := g.podToken(pod)
	want := envd.FileSignature(s.path, s.op, s.user, tok, s.exp)
	return ok && subtle.ConstantTimeCompare([]byte(want), []byte(s.sig)) == 1
}

// signedFiles reports whether r carries a valid /files signature made
// with the pod's token.
func (g *Gateway) signedFiles(r *http.Request, pod *corev1.Pod) bool {
	s, ok := g.readFileSig(r)
	return ok && g.madeFor(s, pod)
}

// e2bSignedFiles serves a signed /files URL that names no sandbox (the
// SDKs build them against E2B_SANDBOX_URL): the running E2B sandbox whose
// token made the signature is the one it is for. The URL is read once;
// then it is one HMAC and one SHA-256 per running E2B sandbox in the
// gateway's cache, every one checked (no early exit, as on the daemon:
// the answer's timing tells nothing of which sandbox or how many).
func (g *Gateway) e2bSignedFiles(w http.ResponseWriter, r *http.Request) {
	const refused = "invalid signature: it was not made for this path and operation by any running sandbox's access token, or it expired"
	s, ok := g.readFileSig(r)
	if !ok {
		e2bwire.WriteError(w, http.StatusUnauthorized, refused)
		return
	}
	pods, err := g.sandboxPods()
	if err != nil {
		e2bwire.WriteErr(w, err)
		return
	}
	var found *corev1.Pod
	for _, pod := range pods {
		if isE2B(pod) && state(pod) == apitypes.StateReady && g.madeFor(s, pod) {
			found = pod
		}
	}
	if found == nil {
		e2bwire.WriteError(w, http.StatusUnauthorized, refused)
		return
	}
	// Checked: straight to its agent, as e2bSandbox would send it.
	g.e2bProxy(w, r, found, "agent/files", false)
}
