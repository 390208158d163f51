package node

import (
	"context"
	"fmt"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A projected volume's serviceAccountToken source is a token of the pod's
// service account that the node asks the API server for (TokenRequest),
// as a kubelet does: for the source's audience (the API server's own when
// unset) and expirationSeconds (an hour when unset), bound to the pod, so
// it stops being valid once the pod is gone. The node asks for a new one
// once 80 % of the token's life has passed, or a day, whichever is
// sooner; the volume sync (filevolumes.go) writes it. The request needs
// create on serviceaccounts/token (the Node authorizer lets a node's
// system:node:<name> identity make tokens for the pods bound to it). A
// service account that does not exist holds the start as a missing
// ConfigMap does; so does a refused request (the message says why).

// defaultTokenSeconds is a token's life when the source sets none.
const defaultTokenSeconds = 3600

// podToken is a token the node holds for a pod's volume.
type podToken struct {
	token     string
	refreshAt time.Time
}

// tokenKey is what a token is asked for with.
func tokenKey(t *corev1.ServiceAccountTokenProjection) string {
	secs := int64(defaultTokenSeconds)
	if t.ExpirationSeconds != nil {
		secs = *t.ExpirationSeconds
	}
	return fmt.Sprintf("%s\x00%d", t.Audience, secs)
}

// serviceAccountToken is a token for the pod's service account as src
// asks, the one held while it is fresh, else a new one.
func (p *Pods) serviceAccountToken(ctx context.Context, ps *podState, pod *corev1.Pod, src *corev1.ServiceAccountTokenProjection) (string, error) {
	k := tokenKey(src)
	p.mu.Lock()
	held, ok := ps.tokens[k]
	p.mu.Unlock()
	if ok && time.Now().Before(held.refreshAt) {
		return held.token, nil
	}
	sa := pod.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	secs := int64(defaultTokenSeconds)
	if src.ExpirationSeconds != nil {
		secs = *src.ExpirationSeconds
	}
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		ExpirationSeconds: &secs,
		BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
	}}
	if src.Audience != "" {
		req.Spec.Audiences = []string{src.Audience}
	}
	asked := time.Now()
	tr, err := p.kube.CoreV1().ServiceAccounts(pod.Namespace).CreateToken(ctx, sa, req, metav1.CreateOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return "", &configError{fmt.Sprintf("service account %s/%s not found", pod.Namespace, sa)}
	case apierrors.IsForbidden(err):
		return "", &configError{fmt.Sprintf("a token of service account %s/%s: %v", pod.Namespace, sa, err)}
	case err != nil:
		return "", fmt.Errorf("a token of service account %s/%s: %w", pod.Namespace, sa, err)
	case tr.Status.Token == "":
		return "", fmt.Errorf("a token of service account %s/%s: the API server returned none", pod.Namespace, sa)
	}
	life := time.Duration(secs) * time.Second
	if exp := tr.Status.ExpirationTimestamp.Time; !exp.IsZero() && exp.After(asked) {
		life = exp.Sub(asked)
	}
	refresh := asked.Add(min(life*8/10, 24*time.Hour))
	p.mu.Lock()
	if ps.tokens == nil {
		ps.tokens = map[string]podToken{}
	}
	ps.tokens[k] = podToken{token: tr.Status.Token, refreshAt: refresh}
	p.mu.Unlock()
	return tr.Status.Token, nil
}
