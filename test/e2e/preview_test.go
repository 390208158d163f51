package e2e

import (
	"bufio"
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/test/harness"
)

// freePort returns a loopback address nothing listens on.
func freePort(t *testing.T) string {
	t.Helper()
	return fmt.Sprintf("127.0.0.1:%d", harness.FreePort(t))
}

// TestPreviewListener: the daemon's preview listeners (port 80 and 443 by
// default; high ports here, so tests leave the host's alone) serve
// "<port>-<id>.berth.localhost" as sandbox.getHost(port) names it, with no
// daemon port: plain HTTP and TLS with the configured certificate reach a
// server in the sandbox, other hosts are refused, and a sandbox that is
// gone answers 502 in E2B's words.
func TestPreviewListener(t *testing.T) {
	plain, secure := freePort(t), freePort(t)
	certFile, keyFile, pool := previewCert(t)
	cfg := filepath.Join(t.TempDir(), "preview.yaml")
	if err := os.WriteFile(cfg, []byte("preview_tls_listen: [\""+secure+"\"]\npreview_tls_cert: "+certFile+"\npreview_tls_key: "+keyFile+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	d := StartDaemon(t, "--config", cfg, "--preview-listen", plain)
	sb := d.Create(t, client.CreateRequest{})
	MustRun(t, sb, "mkdir -p /tmp/www && echo served from inside > /tmp/www/hello.txt")
	if _, _, code := Run(t, sb, "busybox httpd -p 8080 -h /tmp/www"); code != 0 {
		t.Fatal("busybox httpd did not start")
	}
	host := "8080-" + sb.ID + ".berth.localhost"
	get := func(c *http.Client, url, host string) (int, string) {
		t.Helper()
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Host = host
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("GET %s (Host %s): %v", url, host, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get(http.DefaultClient, "http://"+plain+"/hello.txt", host); code != 200 || body != "served from inside\n" {
		t.Errorf("preview over HTTP = %d %q, want the sandbox's file", code, body)
	}
	// TLS: the name is the SNI, verified against the wildcard certificate.
	tc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: host}}}
	if code, body := get(tc, "https://"+secure+"/hello.txt", host); code != 200 || body != "served from inside\n" {
		t.Errorf("preview over TLS = %d %q, want the sandbox's file", code, body)
	}
	// Not a preview host: neither the control plane nor a sandbox.
	if code, body := get(http.DefaultClient, "http://"+plain+"/v1/health", "127.0.0.1"); code != 404 || !strings.Contains(body, "not a Berth preview host") {
		t.Errorf("preview listener for a non-preview host = %d %q, want 404", code, body)
	}
	if code, _ := get(http.DefaultClient, "http://"+plain+"/sandboxes", "example.com"); code != 404 {
		t.Errorf("preview listener for the E2B control plane = %d, want 404", code)
	}
	if err := sb.Kill(t.Context()); err != nil {
		t.Fatal(err)
	}
	code, body := get(http.DefaultClient, "http://"+plain+"/hello.txt", host)
	if code != 502 || !strings.Contains(body, "The sandbox was not found") {
		t.Errorf("preview of a killed sandbox = %d %q, want 502 with E2B's wording", code, body)
	}
}

// previewCert writes a self-signed certificate for *.berth.localhost and
// its key, and returns their files and a pool trusting it.
func previewCert(t *testing.T) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "*.berth.localhost"},
		DNSNames:  []string{"*.berth.localhost"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IsCA: true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}

// TestPortsRoute: /v1/sandboxes/{id}/ports/{port}/… reaches a server in
// the sandbox through the API (the route the Kubernetes gateway reaches
// ports by): the path after the port, the query and the client's Host (as
// X-Forwarded-Host names it) go on, an access token does not; a port nothing
// serves is 502 naming the port; the agent's port and a non-number are
// refused by name; a killed sandbox's ports are gone.
func TestPortsRoute(t *testing.T) {
	d := StartDaemon(t)
	sb := d.Create(t, client.CreateRequest{})
	MustRun(t, sb, `mkdir -p /tmp/www/cgi-bin && echo served from inside > /tmp/www/hello.txt && `+
		`printf '#!/bin/sh\nprintf "Content-Type: text/plain\\r\\n\\r\\n"\necho "host=$HTTP_HOST query=$QUERY_STRING key=$HTTP_X_API_KEY token=$HTTP_X_ACCESS_TOKEN"\n' > /tmp/www/cgi-bin/env && chmod +x /tmp/www/cgi-bin/env`)
	if _, _, code := Run(t, sb, "busybox httpd -p 8080 -h /tmp/www"); code != 0 {
		t.Fatal("busybox httpd did not start")
	}
	base := d.URL + "/v1/sandboxes/" + sb.ID + "/ports/"
	if code, body := callAPI(t, "GET", base+"8080/hello.txt", "", nil); code != 200 || body != "served from inside\n" {
		t.Errorf("GET through the ports route = %d %q, want the sandbox's file", code, body)
	}
	code, body := callAPI(t, "GET", base+"8080/cgi-bin/env?a=1", "", map[string]string{"X-Access-Token": "mine", "X-Forwarded-Host": "app.example"})
	if code != 200 || !strings.Contains(body, "host=app.example query=a=1 ") || !strings.Contains(body, "key= token=\n") {
		t.Errorf("CGI through the ports route = %d %q, want the forwarded host, the query and no token", code, body)
	}
	for _, tc := range []struct {
		path   string
		status int
		code   string
	}{
		{"8081/", 502, "unavailable"},
		{"49983/health", 400, "invalid_argument"},
		{"http/", 400, "invalid_argument"},
		{"70000/", 400, "invalid_argument"},
	} {
		code, body := callAPI(t, "GET", base+tc.path, "", nil)
		var e struct{ Code, Field string }
		if err := json.Unmarshal([]byte(body), &e); err != nil || code != tc.status || e.Code != tc.code || e.Field != "port" {
			t.Errorf("GET ports/%s = %d %s, want %d %s naming port", tc.path, code, body, tc.status, tc.code)
		}
	}
	if err := sb.Kill(t.Context()); err != nil {
		t.Fatal(err)
	}
	if code, body := callAPI(t, "GET", base+"8080/hello.txt", "", nil); code < 400 || code == 502 {
		t.Errorf("GET a killed sandbox's port = %d %q, want its error", code, body)
	}
}

// TestForward: the Go SDK's PortTransport and `berth forward` reach a
// server in the sandbox through the ports route; forward refuses a bad
// port and an unknown sandbox with a clear error, and ends (non-zero)
// once its sandbox is killed.
func TestForward(t *testing.T) {
	d := StartDaemon(t)
	sb := d.Create(t, client.CreateRequest{})
	MustRun(t, sb, "mkdir -p /tmp/www && echo forwarded > /tmp/www/hello.txt && busybox httpd -p 8080 -h /tmp/www")

	hc := &http.Client{Transport: sb.PortTransport(8080)}
	resp, err := hc.Get("http://app.local/hello.txt")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != "forwarded\n" {
		t.Errorf("PortTransport GET = %d %q", resp.StatusCode, b)
	}

	for _, tc := range []struct{ id, port, code string }{
		{sb.ID, "http", "(invalid_argument)"}, {sb.ID, "0", "(invalid_argument)"}, {"nosuchsandbox000000", "8080", "(not_found)"},
	} {
		cmd := exec.CommandContext(t.Context(), bin.Berth, "forward", tc.id, tc.port)
		cmd.Env = append(cmd.Environ(), "BERTH_URL="+d.URL)
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), tc.code) {
			t.Errorf("forward %s %s = %v %q, want %s", tc.id, tc.port, err, out, tc.code)
		}
	}

	cmd, line, stderr := startForward(t, d, sb.ID, "8080")
	var local string
	if _, err := fmt.Sscanf(line, "forwarding %s", &local); err != nil || !strings.HasPrefix(local, "http://127.0.0.1:") {
		t.Fatalf("forward printed %q", line)
	}
	resp, err = http.Get(local + "/hello.txt")
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != "forwarded\n" {
		t.Errorf("GET through berth forward = %d %q", resp.StatusCode, b)
	}
	if err := sb.Kill(t.Context()); err != nil {
		t.Fatal(err)
	}
	// The daemon's event stream ends with the sandbox: so does forward.
	if err := cmd.Wait(); err == nil || !strings.Contains(stderr.String(), "ended") {
		t.Errorf("forward after the kill = %v, stderr %q; want it to end non-zero saying the sandbox ended", err, stderr.String())
	}
}

// startForward starts `berth forward ARGS…` against d and returns it with
// the first line it printed (the local address) and its stderr so far.
func startForward(t *testing.T, d *Daemon, args ...string) (*exec.Cmd, string, *bytes.Buffer) {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), bin.Berth, append([]string{"forward"}, args...)...)
	cmd.Env = append(cmd.Environ(), "BERTH_URL="+d.URL)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr := &bytes.Buffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("forward %v printed nothing: %v (%s)", args, err, stderr.String())
	}
	return cmd, line, stderr
}
