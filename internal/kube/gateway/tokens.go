package gateway

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"net/http"

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

// TokenKeySecret names the Secret holding the key, under its data key
// tokenKeyField.
const TokenKeySecret = "berth-gateway-e2b"

const tokenKeyField = "envd-token-key"

// tokenKeyLen is the key's length in bytes.
const tokenKeyLen = 32

// loadTokenKey reads the shared key, making its Secret when there is
// none (two replicas racing read the one that was made first).
func (g *Gateway) loadTokenKey(ctx context.Context) error {
	secrets := g.cfg.Kube.CoreV1().Secrets(g.cfg.Namespace)
	for range 3 {
		s, err := secrets.Get(ctx, TokenKeySecret, metav1.GetOptions{})
		if err == nil {
			key := s.Data[tokenKeyField]
			if len(key) < tokenKeyLen {
				return fmt.Errorf("secret %s/%s: %s holds %d bytes, want at least %d: %w", g.cfg.Namespace, TokenKeySecret, tokenKeyField, len(key), tokenKeyLen, errdefs.ErrFailedPrecondition)
			}
			g.tokenKey = key
			return nil
		}
		if !apierrors.IsNotFound(err) {
			return kubeErr("read the E2B token key (secret "+TokenKeySecret+")", err)
		}
		key := make([]byte, tokenKeyLen)
		rand.Read(key)
		immutable := true
		_, err = secrets.Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: TokenKeySecret, Labels: map[string]string{LabelManagedBy: ManagedBy}},
			Immutable:  &immutable,
			Data:       map[string][]byte{tokenKeyField: key},
		}, metav1.CreateOptions{})
		switch {
		case err == nil:
			g.log.Info("gateway_token_key_made", "secret", g.cfg.Namespace+"/"+TokenKeySecret)
			g.tokenKey = key
			return nil
		case !apierrors.IsAlreadyExists(err):
			return kubeErr("make the E2B token key (secret "+TokenKeySecret+")", err)
		}
	}
	return fmt.Errorf("secret %s/%s: made and gone again: %w", g.cfg.Namespace, TokenKeySecret, errdefs.ErrUnavailable)
}

// envdToken is the envdAccessToken of the E2B sandbox id.
func (g *Gateway) envdToken(id string) string { return g.derive("berth e2b envd access token", id) }

// trafficToken is the trafficAccessToken of the E2B sandbox id (one made
// with allowPublicTraffic: false).
func (g *Gateway) trafficToken(id string) string {
	return g.derive("berth e2b traffic access token", id)
}

// derive is the token of purpose for sandbox id: 40 hex digits of an
// HMAC-SHA256 keyed by the shared key.
func (g *Gateway) derive(purpose, id string) string {
	m := hmac.New(sha256.New, g.tokenKey)
	m.Write([]byte(purpose + "\x00" + id))
	return hex.EncodeToString(m.Sum(nil)[:20])
}

// tokenHash is what a pod keeps of its token (AnnotationEnvdTokenSHA256).
func tokenHash(token string) string {
	h := sha256.Sum256([]byte(token))
	return hex.EncodeToString(h[:])
}

// podToken is the envdAccessToken of an E2B sandbox's pod, when the pod's
// hash is that of the derived token (a sandbox made under another key,
// or before tokens were derived, has none the gateway can tell).
func (g *Gateway) podToken(pod *corev1.Pod) (string, bool) {
	tok := g.envdToken(sandboxID(pod))
	return tok, tokenMatches(pod, tok)
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
