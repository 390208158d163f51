package egress

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/audit"
	"github.com/berth-sandbox/berth/internal/policy"
)

// TestAdoptCA: a sandbox that adopts another's CA pair (a start from a
// memory image) is prepared with that certificate and its proxy's leaves
// verify against it; a pair that does not belong together, or is not a
// CA, is refused as invalid and writes nothing; CA of a sandbox without
// egress state is not found.
func TestAdoptCA(t *testing.T) {
	al, err := audit.New(audit.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	state := t.TempDir()
	e, err := New(Config{StateDir: state, Audit: al, Upstream: []string{"127.0.0.1:1"}, Guard: &policy.Guard{}, ProxyPort: 18082})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if _, _, err := e.CA("nobody"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("CA before Prepare = %v; want not found", err)
	}
	srcPEM, err := e.Prepare("source")
	if err != nil {
		t.Fatal(err)
	}
	cert, key, err := e.CA("source")
	if err != nil || !bytes.Equal(cert, srcPEM) {
		t.Fatalf("CA(source) = %v; want the certificate Prepare returned", err)
	}
	if _, err := e.Prepare("other"); err != nil {
		t.Fatal(err)
	}
	_, otherKey, err := e.CA("other")
	if err != nil {
		t.Fatal(err)
	}

	// Refused: another sandbox's key, garbage, a leaf instead of a CA.
	src, err := parseCA(cert, key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := src.leaf("example.com")
	if err != nil {
		t.Fatal(err)
	}
	leafPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: leaf.Leaf.Raw})
	for name, pair := range map[string][2][]byte{
		"mismatched key": {cert, otherKey},
		"garbage":        {[]byte("not a cert"), key},
		"leaf":           {leafPEM, key},
	} {
		err := e.AdoptCA("copy", pair[0], pair[1])
		if !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("AdoptCA(%s) = %v; want invalid argument", name, err)
		}
		if _, err := os.Stat(filepath.Join(state, "copy")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("AdoptCA(%s) left state behind: %v", name, err)
		}
	}

	if err := e.AdoptCA("copy", cert, key); err != nil {
		t.Fatal(err)
	}
	got, err := e.Prepare("copy")
	if err != nil || !bytes.Equal(got, cert) {
		t.Fatalf("Prepare(copy) after AdoptCA = %v; want the source's certificate", err)
	}
	if fi, err := os.Stat(filepath.Join(state, "copy", caKeyFile)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("adopted key file: %v, %v; want mode 0600", fi, err)
	}
	ca, err := loadOrCreateCA(filepath.Join(state, "copy"), "copy")
	if err != nil {
		t.Fatal(err)
	}
	l, err := ca.leaf("example.com")
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(src.cert)
	if _, err := l.Leaf.Verify(x509.VerifyOptions{DNSName: "example.com", Roots: roots}); err != nil {
		t.Errorf("the copy's leaf does not verify against the source's CA: %v", err)
	}
}
