package gateway

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	apitypes "github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/auth"
	"github.com/berth-sandbox/berth/internal/kube/node"
)

// NodeTransport is the transport to the nodes' kubelet API port, as the
// API server's --kubelet-client-certificate/-key and
// --kubelet-certificate-authority make it: the gateway's client
// certificate (which the nodes' --client-ca signed) and the CA that signed
// the nodes' serving certificates.
func NodeTransport(certFile, keyFile, caFile string) (*http.Transport, error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("node client certificate: %w", err)
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("node certificate authority: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("node certificate authority %s: no certificate: %w", caFile, errdefs.ErrInvalidArgument)
	}
	return &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSClientConfig:     &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}, RootCAs: pool},
		TLSHandshakeTimeout: 10 * time.Second,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     90 * time.Second,
	}, nil
}

// nodeTarget is where a data-plane request goes: the node's kubelet API
// address and the node's ID of the sandbox.
type nodeTarget struct {
	node, addr, sandbox string
	// path is the node's path, under node.DataPlanePrefix: a route of
	// the sandbox's (nodeOf), or a snapshot's.
	path string
	// rename is the gateway's ID of the sandbox, for the node's to be
	// replaced by in the answer's JSON (rename.go); "" leaves it as is.
	rename string
	// forward tells the node the client's address and Host in
	// X-Forwarded headers (a sandbox port's server sees the host its
	// client used).
	forward bool
}

type targetKey struct{}

// target finds the node and the node's sandbox of a running sandbox pod.
func (g *Gateway) target(pod *corev1.Pod, rest string) (nodeTarget, error) {
	if st := state(pod); st != apitypes.StateReady {
		return nodeTarget{}, fmt.Errorf("sandbox %s is %s: %w", pod.Name, st, errdefs.ErrFailedPrecondition)
	}
	return g.nodeOf(pod, rest)
}

// nodeOf is target for a sandbox in any state that has a node's sandbox
// (what its node's daemon recorded of it reads while it is paused).
func (g *Gateway) nodeOf(pod *corev1.Pod, rest string) (nodeTarget, error) {
	sb, err := sandboxOf(pod)
	if err != nil {
		return nodeTarget{}, err
	}
	t, err := g.nodeAt(pod.Spec.NodeName)
	if err != nil {
		return nodeTarget{}, fmt.Errorf("sandbox %s: %w", pod.Name, err)
	}
	t.sandbox, t.path = sb, "/v1/sandboxes/"+sb+"/"+rest
	return t, nil
}

// nodeAt is the data plane's address on node name: its InternalIP and
// kubelet port.
func (g *Gateway) nodeAt(name string) (nodeTarget, error) {
	n, err := g.nodes.Get(name)
	if apierrors.IsNotFound(err) {
		return nodeTarget{}, fmt.Errorf("its node %s is gone: %w", name, errdefs.ErrUnavailable)
	}
	if err != nil {
		return nodeTarget{}, err
	}
	var ip string
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			ip = a.Address
			break
		}
	}
	port := n.Status.DaemonEndpoints.KubeletEndpoint.Port
	if ip == "" || port <= 0 {
		return nodeTarget{}, fmt.Errorf("node %s has no InternalIP or kubelet port: %w", n.Name, errdefs.ErrUnavailable)
	}
	return nodeTarget{node: n.Name, addr: net.JoinHostPort(ip, strconv.Itoa(int(port)))}, nil
}

// nodeProxy forwards a sandbox's data plane to its node. The target comes
// from the informer caches, never from the request.
func (g *Gateway) nodeProxy() *httputil.ReverseProxy {
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			t := pr.In.Context().Value(targetKey{}).(nodeTarget)
			pr.Out.URL = &url.URL{Scheme: "https", Host: t.addr, Path: node.DataPlanePrefix + t.path, RawQuery: pr.In.URL.RawQuery}
			pr.Out.Host = t.addr
			if t.forward {
				pr.SetXForwarded()
			}
			// The caller's key stays here.
			node.DropAPIKey(pr.Out.Header)
		},
		Transport: g.cfg.NodeTransport,
		ModifyResponse: func(resp *http.Response) error {
			if t, _ := resp.Request.Context().Value(targetKey{}).(nodeTarget); t.rename != "" {
				renamed(resp, t.sandbox, t.rename)
			}
			return nil
		},
		// Process output and watch events stream as they come.
		FlushInterval: -1,
		ErrorLog:      slog.NewLogLogger(g.log.Handler(), slog.LevelDebug),
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if errors.Is(err, context.Canceled) {
				return
			}
			t, _ := r.Context().Value(targetKey{}).(nodeTarget)
			writeError(w, fmt.Errorf("node %s unreachable: %v: %w", t.node, err, errdefs.ErrUnavailable))
		},
	}
}

// proxyReview serves one of node.ReviewRoutes of a sandbox from its node:
// what the node's daemon recorded of it (events, egress policy and
// decisions, work log, diff, usage over time). JSON records name the gateway's sandbox ID,
// as the rest of its API does (rename.go).
func (g *Gateway) proxyReview(route string) func(http.ResponseWriter, *http.Request, auth.Principal) {
	return func(w http.ResponseWriter, r *http.Request, p auth.Principal) {
		pod, err := g.sandboxPod(r.Context(), p, r.PathValue("id"))
		if err != nil {
			writeError(w, err)
			return
		}
		var t nodeTarget
		if st := state(pod); st == apitypes.StateReady || pausedish(st) {
			t, err = g.nodeOf(pod, route)
		} else {
			t, err = g.target(pod, route)
		}
		if err != nil {
			writeError(w, err)
			return
		}
		t.rename = sandboxID(pod)
		g.proxy.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), targetKey{}, t)))
	}
}

func (g *Gateway) proxyAgent(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	g.proxyTo(w, r, p, "agent/"+r.PathValue("rest"), false)
}

// proxyTo proxies a request to the caller's sandbox {id} to rest under
// the sandbox on its node's data plane.
func (g *Gateway) proxyTo(w http.ResponseWriter, r *http.Request, p auth.Principal, rest string, forward bool) {
	pod, err := g.sandboxPod(r.Context(), p, r.PathValue("id"))
	if err == nil {
		pod, err = g.awake(r.Context(), pod)
	}
	if err != nil {
		writeError(w, err)
		return
	}
	t, err := g.target(pod, rest)
	if err != nil {
		writeError(w, err)
		return
	}
	t.forward = forward
	// Request bodies (stdin, uploads) stream while the answer does.
	_ = http.NewResponseController(w).EnableFullDuplex()
	g.proxy.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), targetKey{}, t)))
}

// proxyPort is /v1/sandboxes/{id}/ports/{port}/…, as on a daemon: to the
// server listening on port in the sandbox, through its node (whose
// daemon checks the port), with the client's Host.
func (g *Gateway) proxyPort(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	g.proxyTo(w, r, p, "ports/"+url.PathEscape(r.PathValue("port"))+"/"+r.PathValue("rest"), true)
}

// proxyTunnel is GET /v1/sandboxes/{id}/tunnel/{port}, as on a daemon: a
// TCP connection to the port in the sandbox (an HTTP/1.1 upgrade, which
// the proxies to the node and from it to its daemon carry through,
// half-closes included), checked by the node's daemon.
func (g *Gateway) proxyTunnel(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	g.proxyTo(w, r, p, "tunnel/"+url.PathEscape(r.PathValue("port")), false)
}
