package daemon

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/e2bcompat"
)

// DefaultPreviewListen is where the daemon serves preview hosts
// (`sandbox.getHost(port)`, "<port>-<id>.<domain>") unless configured: port
// 80 on loopback, both families, since the default domain berth.localhost
// resolves to 127.0.0.1 and ::1 (nss-myhostname, systemd-resolved, curl,
// browsers). Binding them is best effort: a busy port 80 is logged and the
// daemon serves on without it. Addresses the operator configures must bind.
var DefaultPreviewListen = []string{"127.0.0.1:80", "[::1]:80"}

// previewServers are the listeners of preview hosts: plain HTTP on
// cfg.PreviewListen and, with a certificate, TLS on cfg.PreviewTLSListen.
type previewServers struct {
	servers []*http.Server
}

// startPreview binds the preview listeners and serves h on them, for hosts
// under domain only (anything else is 404: these listeners are no way into
// the control plane). Serve errors go to errc.
func startPreview(cfg Config, domain string, h http.Handler, errc chan<- error, log *slog.Logger) (*previewServers, error) {
	ph := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, _, ok := e2bcompat.ParseHost(r.Host, domain); !ok {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.WriteHeader(http.StatusNotFound)
			fmt.Fprintf(w, "not a Berth preview host: want PORT-SANDBOXID.%s\n", domain)
			return
		}
		h.ServeHTTP(w, r)
	})
	ps := &previewServers{}
	plain, best := cfg.PreviewListen, false
	if len(plain) == 0 {
		plain, best = DefaultPreviewListen, true
	}
	var tlsCfg *tls.Config
	if cfg.PreviewTLSCert != "" || cfg.PreviewTLSKey != "" {
		cert, err := tls.LoadX509KeyPair(cfg.PreviewTLSCert, cfg.PreviewTLSKey)
		if err != nil {
			return nil, fmt.Errorf("preview_tls_cert/preview_tls_key: %w", err)
		}
		tlsCfg = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	}
	secure, bestTLS := cfg.PreviewTLSListen, false
	if len(secure) == 0 && tlsCfg != nil {
		secure, bestTLS = []string{"127.0.0.1:443", "[::1]:443"}, true
	}
	if len(secure) > 0 && !isOff(secure) && tlsCfg == nil {
		return nil, fmt.Errorf("preview_tls_listen needs preview_tls_cert and preview_tls_key: %w", errdefs.ErrInvalidArgument)
	}
	listen := func(addrs []string, best bool, tc *tls.Config) error {
		for _, a := range realAddrs(addrs) {
			ln, err := net.Listen("tcp", a)
			if err != nil {
				if best {
					log.Warn("preview_listen_unavailable", "addr", a, "err", err)
					continue
				}
				return fmt.Errorf("preview listen %s: %w", a, err)
			}
			if tc != nil {
				ln = tls.NewListener(ln, tc)
			}
			s := &http.Server{Handler: ph, ReadHeaderTimeout: 10 * time.Second}
			ps.servers = append(ps.servers, s)
			log.Info("preview_listening", "addr", ln.Addr().String(), "tls", tc != nil, "domain", domain)
			go func() {
				if err := s.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
					errc <- fmt.Errorf("preview %s: %w", a, err)
				}
			}()
		}
		return nil
	}
	if err := listen(plain, best, nil); err != nil {
		ps.shutdown(context.Background())
		return nil, err
	}
	if err := listen(secure, bestTLS, tlsCfg); err != nil {
		ps.shutdown(context.Background())
		return nil, err
	}
	return ps, nil
}

// isOff is the configured "none" (or "off"): no listener, unless real
// addresses follow (a later --preview-listen adds to an earlier "none").
func isOff(addrs []string) bool {
	return len(addrs) > 0 && len(realAddrs(addrs)) == 0
}

// realAddrs drops the "none" and "off" entries.
func realAddrs(addrs []string) []string {
	var out []string
	for _, a := range addrs {
		if !strings.EqualFold(a, "none") && !strings.EqualFold(a, "off") {
			out = append(out, a)
		}
	}
	return out
}

func (ps *previewServers) shutdown(ctx context.Context) {
	for _, s := range ps.servers {
		if err := s.Shutdown(ctx); err != nil {
			s.Close()
		}
	}
}
