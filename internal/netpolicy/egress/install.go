package egress

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"net/url"
	"time"
)

// Paths inside the sandbox: the CA alone, in Debian's local trust store,
// and appended to the system bundle (what OpenSSL-, Python-, git- and
// Go-based clients read through SSL_CERT_FILE and friends).
const (
	CAPath           = "/etc/berth/egress-ca.pem"
	BundlePath       = "/etc/berth/ca-bundle.pem"
	systemBundlePath = "/etc/ssl/certs/ca-certificates.crt"
	debianCAPath     = "/usr/local/share/ca-certificates/berth-egress.crt"
)

// Install writes resolv.conf (the gateway is the sandbox's resolver) and
// the sandbox's CA into it through its agent at agentAddr.
func (e *Egress) Install(ctx context.Context, agentAddr, token string, gateway netip.Addr, ca []byte) error {
	// One-off client: these few calls must not leave idle connections.
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	bundle := agentRead(ctx, hc, agentAddr, token, systemBundlePath)
	if len(bundle) > 0 && !bytes.HasSuffix(bundle, []byte("\n")) {
		bundle = append(bundle, '\n')
	}
	files := []struct {
		path string
		body []byte
	}{
		{"/etc/resolv.conf", []byte("# written by berth: the sandbox's filtering resolver\nnameserver " + gateway.String() + "\noptions edns0\n")},
		{CAPath, ca},
		{debianCAPath, ca},
		{BundlePath, append(bundle, ca...)},
	}
	for _, f := range files {
		if err := agentWrite(ctx, hc, agentAddr, token, f.path, f.body); err != nil {
			return fmt.Errorf("write %s in the sandbox: %w", f.path, err)
		}
	}
	return nil
}

func agentWrite(ctx context.Context, hc *http.Client, addr, token, path string, body []byte) error {
	u := "http://" + addr + "/files?username=root&path=" + url.QueryEscape(path)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	req.Header.Set("X-Access-Token", token)
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("agent answered %s: %s", resp.Status, msg)
	}
	return nil
}

// agentRead returns a file's content, or nil when it cannot be read.
func agentRead(ctx context.Context, hc *http.Client, addr, token, path string) []byte {
	u := "http://" + addr + "/files?username=root&path=" + url.QueryEscape(path)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil
	}
	req.Header.Set("X-Access-Token", token)
	resp, err := hc.Do(req)
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	return b
}
