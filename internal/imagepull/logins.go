package imagepull

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"github.com/berth-sandbox/berth/errdefs"
)

// Logins are the registry credentials `berth registry login` gave the
// daemon: one root-only file in Docker's config.json format
// ({"auths": {"host": {"auth": base64("user:password")}}}), so it can be
// read (or written) with Docker's tools too. They are consulted before
// the daemon user's ~/.docker/config.json.
type Logins struct {
	path string
	mu   sync.Mutex
}

// Login is one stored login, without its secret.
type Login struct {
	Registry string
	Username string
}

// NewLogins returns the logins stored at path (a file that need not exist
// yet; its directory must).
func NewLogins(path string) *Logins { return &Logins{path: path} }

type dockerConfig struct {
	Auths map[string]dockerAuth `json:"auths"`
}

type dockerAuth struct {
	Auth string `json:"auth,omitempty"`
}

// registryKey is the name a registry is stored under: go-containerregistry's
// form of it (docker.io is index.docker.io), so lookups by a resolved
// reference find it.
func registryKey(host string) (string, error) {
	if host == "" || strings.ContainsAny(host, "/ \t\n@") {
		return "", fmt.Errorf("registry %q: want a host[:port]: %w", host, errdefs.ErrInvalidArgument)
	}
	r, err := name.NewRegistry(host)
	if err != nil {
		return "", fmt.Errorf("registry %q: %v: %w", host, err, errdefs.ErrInvalidArgument)
	}
	return r.RegistryStr(), nil
}

func (l *Logins) read() (dockerConfig, error) {
	var c dockerConfig
	b, err := os.ReadFile(l.path)
	if errors.Is(err, fs.ErrNotExist) {
		return dockerConfig{Auths: map[string]dockerAuth{}}, nil
	}
	if err != nil {
		return c, fmt.Errorf("registry logins: %w", err)
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return c, fmt.Errorf("registry logins %s: %w", l.path, err)
	}
	if c.Auths == nil {
		c.Auths = map[string]dockerAuth{}
	}
	return c, nil
}

// write replaces the file atomically, root-only: it holds passwords.
func (l *Logins) write(c dockerConfig) error {
	b, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(l.path), ".registry-auth-*")
	if err != nil {
		return fmt.Errorf("registry logins: %w", err)
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return err
	}
	_, err = tmp.Write(append(b, '\n'))
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), l.path)
	}
	if err != nil {
		return fmt.Errorf("registry logins: %w", err)
	}
	return nil
}

// Resolve implements authn.Keychain.
func (l *Logins) Resolve(target authn.Resource) (authn.Authenticator, error) {
	l.mu.Lock()
	c, err := l.read()
	l.mu.Unlock()
	if err != nil {
		return nil, err
	}
	a, ok := c.Auths[target.RegistryStr()]
	if !ok || a.Auth == "" {
		return authn.Anonymous, nil
	}
	user, pass, err := decodeAuth(a.Auth)
	if err != nil {
		return nil, fmt.Errorf("registry logins: %s: %w", target.RegistryStr(), err)
	}
	return &authn.Basic{Username: user, Password: pass}, nil
}

func decodeAuth(s string) (string, string, error) {
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return "", "", errors.New("auth is not base64")
	}
	user, pass, ok := strings.Cut(string(b), ":")
	if !ok {
		return "", "", errors.New("auth is not user:password")
	}
	return user, pass, nil
}

// List returns the stored logins, sorted by registry.
func (l *Logins) List() ([]Login, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	c, err := l.read()
	if err != nil {
		return nil, err
	}
	out := []Login{}
	for reg, a := range c.Auths {
		user, _, err := decodeAuth(a.Auth)
		if err != nil {
			continue
		}
		out = append(out, Login{Registry: reg, Username: user})
	}
	slices.SortFunc(out, func(a, b Login) int { return strings.Compare(a.Registry, b.Registry) })
	return out, nil
}

// store records user's password for the registry key.
func (l *Logins) store(key, user, password string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	c, err := l.read()
	if err != nil {
		return err
	}
	c.Auths[key] = dockerAuth{Auth: base64.StdEncoding.EncodeToString([]byte(user + ":" + password))}
	return l.write(c)
}

// Logout forgets the registry's login; ErrNotFound when there is none.
func (l *Logins) Logout(host string) error {
	key, err := registryKey(host)
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	c, err := l.read()
	if err != nil {
		return err
	}
	if _, ok := c.Auths[key]; !ok {
		return fmt.Errorf("no login for registry %s: %w", key, errdefs.ErrNotFound)
	}
	delete(c.Auths, key)
	return l.write(c)
}

// Login checks user and password against the registry at host (as docker
// login does: the registry's /v2/ must accept them) and stores them for
// the daemon's pulls. Refused credentials are ErrUnauthenticated, an
// unreachable registry ErrUnavailable, both naming the registry.
func (p *Puller) Login(ctx context.Context, host, user, password string) error {
	if p.cfg.Logins == nil {
		return fmt.Errorf("registry logins are not configured: %w", errdefs.ErrFailedPrecondition)
	}
	key, err := registryKey(host)
	if err != nil {
		return err
	}
	if user == "" || strings.ContainsAny(user, ":\n") || len(user) > 256 {
		return fmt.Errorf("username %q: want a non-empty name without ':': %w", user, errdefs.ErrInvalidArgument)
	}
	if password == "" || len(password) > 64<<10 {
		return fmt.Errorf("password: empty or longer than 64 KiB: %w", errdefs.ErrInvalidArgument)
	}
	opts := []name.Option{}
	if slices.Contains(p.cfg.Insecure, key) {
		opts = append(opts, name.Insecure)
	}
	reg, err := name.NewRegistry(key, opts...)
	if err != nil {
		return fmt.Errorf("registry %q: %v: %w", host, err, errdefs.ErrInvalidArgument)
	}
	if err := p.verify(ctx, reg, &authn.Basic{Username: user, Password: password}); err != nil {
		return err
	}
	return p.cfg.Logins.store(key, user, password)
}

// verify asks the registry's /v2/ with auth.
func (p *Puller) verify(ctx context.Context, reg name.Registry, auth authn.Authenticator) error {
	rt := p.cfg.Transport
	if rt == nil {
		rt = http.DefaultTransport
	}
	ref, _ := name.ParseReference(reg.RegistryStr() + "/berth-login-check:latest")
	t, err := transport.NewWithContext(ctx, reg, auth, rt, []string{reg.Scope(transport.PullScope)})
	if err != nil {
		return loginError(reg, ref, err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, reg.Scheme()+"://"+reg.RegistryStr()+"/v2/", nil)
	if err != nil {
		return err
	}
	resp, err := (&http.Client{Transport: t}).Do(req)
	if err != nil {
		return loginError(reg, ref, err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	switch {
	case resp.StatusCode == http.StatusOK:
		return nil
	case resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden:
		return fmt.Errorf("registry %s refused the credentials: %w", reg.RegistryStr(), errdefs.ErrUnauthenticated)
	}
	return fmt.Errorf("registry %s answered /v2/ with %s: %w", reg.RegistryStr(), resp.Status, errdefs.ErrUnavailable)
}

func loginError(reg name.Registry, ref name.Reference, err error) error {
	var terr *transport.Error
	if errors.As(err, &terr) && (terr.StatusCode == http.StatusUnauthorized || terr.StatusCode == http.StatusForbidden) {
		return fmt.Errorf("registry %s refused the credentials: %v: %w", reg.RegistryStr(), err, errdefs.ErrUnauthenticated)
	}
	return registryError(ref, err)
}

// Logout forgets the daemon's login for host.
func (p *Puller) Logout(host string) error {
	if p.cfg.Logins == nil {
		return fmt.Errorf("registry logins are not configured: %w", errdefs.ErrFailedPrecondition)
	}
	return p.cfg.Logins.Logout(host)
}

// Logins lists the daemon's registry logins (no secrets).
func (p *Puller) Logins() ([]Login, error) {
	if p.cfg.Logins == nil {
		return []Login{}, nil
	}
	return p.cfg.Logins.List()
}
