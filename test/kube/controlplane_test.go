package kube

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/berth-sandbox/berth/test/harness"
)

// controlPlane is a real Kubernetes control plane on loopback: etcd,
// kube-apiserver and kube-scheduler, built by scripts/k8s-bins.sh.
type controlPlane struct {
	dir        string
	Kubeconfig string
	Config     *rest.Config
	Client     *kubernetes.Clientset
	// CA signs every certificate here; NodeCert/NodeKey serve a node's
	// kubelet API (127.0.0.1), which accepts clients the CA signed (the
	// API server's kubelet client certificate).
	CA, NodeCert, NodeKey string
	// pki issues further certificates from CA (a gateway's client
	// certificate toward the nodes).
	pki *pki
}

// binDir finds the cached control plane binaries, or skips: they come
// from scripts/k8s-bins.sh, which scripts/test.sh runs first.
func binDir(t *testing.T) string {
	t.Helper()
	script := filepath.Join(repoRoot(t), "scripts", "k8s-bins.sh")
	if err := exec.Command(script, "--check").Run(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("the Kubernetes control plane is not built: scripts/test.sh runs scripts/k8s-bins.sh first")
		}
		t.Skipf("the Kubernetes control plane is not built: run scripts/k8s-bins.sh (builds kube-apiserver, kube-scheduler and etcd once into the cache)")
	}
	out, err := exec.Command(script).Output()
	if err != nil {
		t.Fatalf("k8s-bins.sh: %v", err)
	}
	return strings.TrimSpace(string(out))
}

func repoRoot(t *testing.T) string {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(wd, "..", "..")
}

func freePort(t *testing.T) int {
	t.Helper()
	return harness.FreePort(t)
}

// startControlPlane starts etcd, the API server and the scheduler, each
// stopped when the test ends. apiserverArgs go to kube-apiserver after
// its own.
func startControlPlane(t *testing.T, apiserverArgs ...string) *controlPlane {
	t.Helper()
	bins := binDir(t)
	dir := t.TempDir()
	cp := &controlPlane{dir: dir}
	pki := newPKI(t, dir)
	cp.CA, cp.pki = pki.caFile, pki
	serving := pki.issue(t, "apiserver", "kube-apiserver", nil, true)
	admin := pki.issue(t, "admin", "admin", []string{"system:masters"}, false)
	kubeletClient := pki.issue(t, "kubelet-client", "kube-apiserver-kubelet-client", []string{"system:masters"}, false)
	node := pki.issue(t, "node", "berth-node", nil, true)
	cp.NodeCert, cp.NodeKey = node.cert, node.key
	saKey := pki.serviceAccountKey(t)

	etcdClient, etcdPeer := freePort(t), freePort(t)
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", etcdClient)
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", etcdPeer)
	start(t, "etcd", filepath.Join(bins, "etcd"),
		"--name", "default", "--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", etcdURL, "--advertise-client-urls", etcdURL,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "default="+peerURL, "--unsafe-no-fsync", "--log-level", "warn")

	port := freePort(t)
	server := fmt.Sprintf("https://127.0.0.1:%d", port)
	start(t, "kube-apiserver", filepath.Join(bins, "kube-apiserver"), append([]string{
		"--etcd-servers", etcdURL,
		"--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1", "--secure-port", fmt.Sprint(port),
		"--tls-cert-file", serving.cert, "--tls-private-key-file", serving.key,
		"--client-ca-file", pki.caFile,
		"--service-account-issuer", "https://kubernetes.default.svc",
		"--service-account-key-file", saKey, "--service-account-signing-key-file", saKey,
		// TEST-NET-1: services get addresses nothing routes to.
		"--service-cluster-ip-range", "192.0.2.0/24",
		"--authorization-mode", "RBAC",
		// No controller manager runs here: nothing would make the
		// default service account (whose token Berth nodes do not
		// mount anyway) or lift the not-ready taint that
		// TaintNodesByCondition puts on every new node.
		"--disable-admission-plugins", "ServiceAccount,TaintNodesByCondition",
		// A loopback advertise address is not a valid endpoint.
		"--endpoint-reconciler-type", "none",
		"--kubelet-client-certificate", kubeletClient.cert, "--kubelet-client-key", kubeletClient.key,
		"--kubelet-certificate-authority", pki.caFile,
		"--kubelet-preferred-address-types", "InternalIP",
		"--cert-dir", filepath.Join(dir, "apiserver-certs")}, apiserverArgs...)...)

	cp.Kubeconfig = filepath.Join(dir, "admin.kubeconfig")
	writeKubeconfig(t, cp.Kubeconfig, server, pki.caFile, admin)
	rc, err := clientcmd.BuildConfigFromFlags("", cp.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cp.Config = rc
	if cp.Client, err = kubernetes.NewForConfig(rc); err != nil {
		t.Fatal(err)
	}
	waitReady(t, cp.Client)
	start(t, "kube-scheduler", filepath.Join(bins, "kube-scheduler"),
		"--kubeconfig", cp.Kubeconfig,
		"--authentication-kubeconfig", cp.Kubeconfig, "--authorization-kubeconfig", cp.Kubeconfig,
		"--leader-elect=false", "--bind-address", "127.0.0.1", "--secure-port", fmt.Sprint(freePort(t)))
	return cp
}

// waitReady waits until the API server answers /readyz.
func waitReady(t *testing.T, c *kubernetes.Clientset) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	var last error
	for {
		body, err := c.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err == nil && string(body) == "ok" {
			return
		}
		last = err
		select {
		case <-ctx.Done():
			t.Fatalf("kube-apiserver not ready: %v", last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// start runs a control plane process, SIGTERMed when the test ends; its
// output is shown if the test failed. The function it returns SIGTERMs it
// earlier and waits for it to exit.
func start(t *testing.T, name, bin string, args ...string) func() {
	t.Helper()
	cmd := exec.Command(bin, args...)
	var mu sync.Mutex
	var out bytes.Buffer
	w := writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		if out.Len() < 4<<20 {
			out.Write(p)
		}
		return len(p), nil
	})
	cmd.Stdout, cmd.Stderr = w, w
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	stop := func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	}
	t.Cleanup(func() {
		stop()
		if t.Failed() {
			mu.Lock()
			defer mu.Unlock()
			s := out.String()
			if len(s) > 20000 {
				s = "…" + s[len(s)-20000:]
			}
			t.Logf("%s output:\n%s", name, s)
		}
	})
	return stop
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// pki is a test CA.
type pki struct {
	dir    string
	caFile string
	ca     *x509.Certificate
	caKey  *ecdsa.PrivateKey
	serial int64
}

type keyPair struct{ cert, key string }

func newPKI(t *testing.T, dir string) *pki {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "berth-test-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	p := &pki{dir: dir, caFile: filepath.Join(dir, "ca.pem"), ca: ca, caKey: key, serial: 1}
	writePEM(t, p.caFile, "CERTIFICATE", der)
	return p
}

// issue makes a certificate for 127.0.0.1 and localhost (server) or a
// client certificate with the given user and groups.
func (p *pki) issue(t *testing.T, file, cn string, orgs []string, server bool) keyPair {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	p.serial++
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(p.serial), Subject: pkix.Name{CommonName: cn, Organization: orgs},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
		tmpl.DNSNames = []string{"localhost"}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &key.PublicKey, p.caKey)
	if err != nil {
		t.Fatal(err)
	}
	kp := keyPair{cert: filepath.Join(p.dir, file+".pem"), key: filepath.Join(p.dir, file+"-key.pem")}
	writePEM(t, kp.cert, "CERTIFICATE", der)
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	writePEM(t, kp.key, "EC PRIVATE KEY", kder)
	return kp
}

// serviceAccountKey is the key the API server signs tokens with.
func (p *pki) serviceAccountKey(t *testing.T) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(p.dir, "sa-key.pem")
	writePEM(t, f, "EC PRIVATE KEY", der)
	return f
}

func writePEM(t *testing.T, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

func writeKubeconfig(t *testing.T, path, server, ca string, user keyPair) {
	t.Helper()
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["test"] = &clientcmdapi.Cluster{Server: server, CertificateAuthority: ca}
	cfg.AuthInfos["admin"] = &clientcmdapi.AuthInfo{ClientCertificate: user.cert, ClientKey: user.key}
	cfg.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "admin"}
	cfg.CurrentContext = "test"
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
}
