package egress

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/berth-sandbox/berth/errdefs"
)

// sandboxCA is a sandbox's own certificate authority for intercepted TLS.
// Its key lives on the host only (0600 under the daemon's state dir, so a
// restarted daemon keeps serving certificates the sandbox trusts) and is
// deleted with the sandbox.
type sandboxCA struct {
	cert   *x509.Certificate
	key    *ecdsa.PrivateKey
	pem    []byte
	mu     sync.Mutex
	leaves map[string]*tls.Certificate
}

const (
	caKeyFile  = "ca.key"
	caCertFile = "ca.pem"
)

// loadOrCreateCA reads dir's CA, or makes one.
func loadOrCreateCA(dir, id string) (*sandboxCA, error) {
	certPEM, cerr := os.ReadFile(filepath.Join(dir, caCertFile))
	keyPEM, kerr := os.ReadFile(filepath.Join(dir, caKeyFile))
	if cerr == nil && kerr == nil {
		return parseCA(certPEM, keyPEM)
	}
	if !errors.Is(cerr, os.ErrNotExist) && cerr != nil {
		return nil, cerr
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "Berth egress CA " + id, Organization: []string{"Berth sandbox " + id}},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(2 * 365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	certPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyPEM = pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder})
	if err := writeFileAtomic(filepath.Join(dir, caKeyFile), keyPEM, 0o600); err != nil {
		return nil, err
	}
	if err := writeFileAtomic(filepath.Join(dir, caCertFile), certPEM, 0o644); err != nil {
		return nil, err
	}
	return parseCA(certPEM, keyPEM)
}

func parseCA(certPEM, keyPEM []byte) (*sandboxCA, error) {
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return nil, errors.New("sandbox CA: bad PEM")
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("sandbox CA: %w", err)
	}
	k, err := x509.ParsePKCS8PrivateKey(kb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("sandbox CA key: %w", err)
	}
	key, ok := k.(*ecdsa.PrivateKey)
	if !ok {
		return nil, errors.New("sandbox CA key is not ECDSA")
	}
	if !cert.IsCA || !key.PublicKey.Equal(cert.PublicKey) {
		return nil, errors.New("sandbox CA: the certificate is not a CA for that key")
	}
	return &sandboxCA{cert: cert, key: key, pem: certPEM, leaves: map[string]*tls.Certificate{}}, nil
}

// CA returns sandbox id's CA certificate and key (PEM). A memory snapshot
// keeps them: the processes in its image have read the certificate and
// trust it, so a sandbox started from the image must sign with that CA.
func (e *Egress) CA(id string) (certPEM, keyPEM []byte, err error) {
	if err := validID(id); err != nil {
		return nil, nil, err
	}
	certPEM, err = os.ReadFile(filepath.Join(e.dir(id), caCertFile))
	if err == nil {
		keyPEM, err = os.ReadFile(filepath.Join(e.dir(id), caKeyFile))
	}
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil, fmt.Errorf("sandbox %s has no egress CA: %w", id, errdefs.ErrNotFound)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("sandbox %s CA: %w", id, err)
	}
	return certPEM, keyPEM, nil
}

// AdoptCA makes certPEM/keyPEM (as CA returned them for another sandbox)
// sandbox id's CA, before its Prepare: a sandbox started from a memory
// image signs with the CA its processes already trust. The pair is
// checked first (a CA certificate for that ECDSA key); nothing is written
// when it is bad.
func (e *Egress) AdoptCA(id string, certPEM, keyPEM []byte) error {
	if err := validID(id); err != nil {
		return err
	}
	if _, err := parseCA(certPEM, keyPEM); err != nil {
		return fmt.Errorf("sandbox %s: adopt CA: %w: %w", id, err, errdefs.ErrInvalidArgument)
	}
	if err := os.MkdirAll(e.dir(id), 0o700); err != nil {
		return fmt.Errorf("egress state for %s: %w", id, err)
	}
	// The key first: a daemon killed between the two writes leaves a key
	// without a certificate, which loadOrCreateCA replaces with a fresh
	// pair, never a certificate paired with a key it does not belong to.
	if err := os.Remove(filepath.Join(e.dir(id), caCertFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if err := writeFileAtomic(filepath.Join(e.dir(id), caKeyFile), keyPEM, 0o600); err != nil {
		return err
	}
	return writeFileAtomic(filepath.Join(e.dir(id), caCertFile), certPEM, 0o644)
}

// leaf returns a certificate for name signed by the CA, cached.
func (ca *sandboxCA) leaf(name string) (*tls.Certificate, error) {
	ca.mu.Lock()
	defer ca.mu.Unlock()
	if c := ca.leaves[name]; c != nil && time.Until(c.Leaf.NotAfter) > time.Hour {
		return c, nil
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(7 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	if ip, err := netip.ParseAddr(name); err == nil {
		tmpl.IPAddresses = append(tmpl.IPAddresses, ip.AsSlice())
	} else {
		tmpl.DNSNames = []string{name}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	c := &tls.Certificate{Certificate: [][]byte{der, ca.cert.Raw}, PrivateKey: key, Leaf: leaf}
	if len(ca.leaves) > 1024 {
		clear(ca.leaves)
	}
	ca.leaves[name] = c
	return c, nil
}

// writeFileAtomic replaces path with data through a rename, so a daemon
// killed mid-write leaves the old file or the new one. It does not fsync
// (three per create cost about 20 ms on a small VM's disk): the files are
// one sandbox's state (CA, policy), needed only while that sandbox runs,
// and whatever loses the page cache (a host crash) ends the sandbox too.
func writeFileAtomic(path string, data []byte, mode os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return err
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
