// Package imagepull reaches OCI/Docker registries for image templates,
// through go-containerregistry: it resolves a reference (mirrors first,
// plain HTTP for loopback and configured insecure registries, credentials
// from ~/.docker/config.json), picks the linux image of the host's
// architecture from a manifest list, and classifies registry failures
// (unknown image: not found; unreachable: unavailable, naming the
// registry). It implements template.Puller, so the template store, which
// the sandbox Manager imports, links no HTTP.
package imagepull

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"runtime"
	"slices"
	"strings"
	"syscall"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/template"
)

// Config configures how image templates reach registries.
type Config struct {
	// Mirrors maps a registry host ("docker.io", "ghcr.io") to a mirror URL
	// tried first ("http://127.0.0.1:5000"); http:// mirrors are reached
	// over plain HTTP. If the mirror fails, the registry itself is tried.
	Mirrors map[string]string
	// Insecure lists registry hosts ("host:port") reached over plain HTTP.
	// Registries on loopback always are, as Docker does.
	Insecure []string
	// Keychain finds credentials; default authn.DefaultKeychain
	// (~/.docker/config.json and credential helpers), after Logins.
	Keychain authn.Keychain
	// Logins, when set, holds `berth registry login`'s credentials,
	// consulted first.
	Logins *Logins
	// Transport is the HTTP transport; default http.DefaultTransport.
	Transport http.RoundTripper
}

// dockerHub are the names Docker Hub goes by; a mirror configured for any
// of them serves all.
var dockerHub = []string{"docker.io", "index.docker.io", "registry-1.docker.io"}

// validate checks the mirror URLs and insecure hosts.
func (r Config) validate() error {
	for host, m := range r.Mirrors {
		if host == "" || strings.ContainsAny(host, "/ ") {
			return fmt.Errorf("registry_mirrors: %q is not a registry host: %w", host, errdefs.ErrInvalidArgument)
		}
		if _, _, err := mirrorHost(m); err != nil {
			return fmt.Errorf("registry_mirrors[%s]: %w", host, err)
		}
	}
	for _, h := range r.Insecure {
		if h == "" || strings.ContainsAny(h, "/ ") {
			return fmt.Errorf("insecure_registries: %q is not a host[:port]: %w", h, errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

// mirrorHost returns the host[:port] of a mirror URL and whether it is
// plain HTTP. A bare host[:port] means https.
func mirrorHost(m string) (string, bool, error) {
	if !strings.Contains(m, "://") {
		m = "https://" + m
	}
	u, err := url.Parse(m)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" {
		return "", false, fmt.Errorf("mirror %q: want http(s)://host[:port]: %w", m, errdefs.ErrInvalidArgument)
	}
	return u.Host, u.Scheme == "http", nil
}

// Puller pulls images from registries; it implements template.Puller.
type Puller struct{ cfg Config }

// New checks cfg and returns a Puller.
func New(cfg Config) (*Puller, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Puller{cfg: cfg}, nil
}

// Check validates ref without the network.
func (p *Puller) Check(ref string) error {
	_, err := ParseImageRef(ref)
	return err
}

// Resolve fetches ref's manifest and config: for a manifest list, its
// linux image for the host's architecture.
func (p *Puller) Resolve(ctx context.Context, ref string) (template.Image, error) {
	parsed, err := ParseImageRef(ref)
	if err != nil {
		return template.Image{}, err
	}
	pl, err := p.cfg.resolve(ctx, parsed)
	if err != nil {
		return template.Image{}, err
	}
	cfg, err := pl.image.ConfigFile()
	if err != nil {
		return template.Image{}, registryError(pl.from, err)
	}
	v1layers, err := pl.image.Layers()
	if err != nil {
		return template.Image{}, registryError(pl.from, err)
	}
	img := template.Image{
		Name: parsed.Name(), Digest: pl.digest, Registry: pl.from.Context().RegistryStr(), OS: cfg.OS,
		Env: cfg.Config.Env, Workdir: cfg.Config.WorkingDir, User: cfg.Config.User,
		Entrypoint: cfg.Config.Entrypoint, Cmd: cfg.Config.Cmd,
	}
	for _, l := range v1layers {
		d, err := l.DiffID()
		if err != nil {
			return template.Image{}, registryError(pl.from, err)
		}
		size, _ := l.Size()
		img.Layers = append(img.Layers, layer{l: l, from: pl.from, diffID: d.String(), size: size})
	}
	return img, nil
}

// layer is one layer of a resolved image.
type layer struct {
	l      v1.Layer
	from   name.Reference
	diffID string
	size   int64
}

func (l layer) DiffID() string { return l.diffID }
func (l layer) Size() int64    { return l.size }

// Open streams the layer uncompressed; errors reading it are the
// registry's (unavailable).
func (l layer) Open() (io.ReadCloser, error) {
	rc, err := l.l.Uncompressed()
	if err != nil {
		return nil, registryError(l.from, err)
	}
	return classifiedReader{rc: rc, from: l.from}, nil
}

type classifiedReader struct {
	rc   io.ReadCloser
	from name.Reference
}

func (c classifiedReader) Read(p []byte) (int, error) {
	n, err := c.rc.Read(p)
	if err != nil && !errors.Is(err, io.EOF) {
		err = registryError(c.from, err)
	}
	return n, err
}

func (c classifiedReader) Close() error { return c.rc.Close() }

// ParseImageRef checks an image reference ("debian:bookworm",
// "127.0.0.1:5000/tools/py@sha256:…") and returns it in full form. Errors
// are errdefs.ErrInvalidArgument.
func ParseImageRef(ref string) (name.Reference, error) {
	if strings.TrimSpace(ref) != ref || ref == "" {
		return nil, fmt.Errorf("image reference %q: empty or padded with spaces: %w", ref, errdefs.ErrInvalidArgument)
	}
	r, err := name.ParseReference(ref)
	if err != nil {
		return nil, fmt.Errorf("image reference %q: %v: %w", ref, err, errdefs.ErrInvalidArgument)
	}
	return r, nil
}

// candidates are the places to pull ref from, in order: the configured
// mirror of its registry, then the registry itself (marked insecure when
// configured so).
func (r Config) candidates(ref name.Reference) ([]name.Reference, error) {
	reg := ref.Context().RegistryStr()
	var out []name.Reference
	mirror, ok := r.Mirrors[reg]
	if !ok && slices.Contains(dockerHub, reg) {
		for _, h := range dockerHub {
			if m, found := r.Mirrors[h]; found {
				mirror, ok = m, true
				break
			}
		}
	}
	if ok {
		host, plain, err := mirrorHost(mirror)
		if err != nil {
			return nil, err
		}
		var opts []name.Option
		if plain || slices.Contains(r.Insecure, host) {
			opts = append(opts, name.Insecure)
		}
		sep := ":"
		if _, isDigest := ref.(name.Digest); isDigest {
			sep = "@"
		}
		m, err := name.ParseReference(host+"/"+ref.Context().RepositoryStr()+sep+ref.Identifier(), opts...)
		if err != nil {
			return nil, fmt.Errorf("mirror reference for %s: %w", ref, err)
		}
		out = append(out, m)
	}
	if slices.Contains(r.Insecure, reg) {
		var err error
		if ref, err = name.ParseReference(ref.String(), name.Insecure); err != nil {
			return nil, err
		}
	}
	return append(out, ref), nil
}

// pulled is a resolved image: its manifest digest (of the index, for a
// multi-platform image) and the platform's image.
type pulled struct {
	from   name.Reference // where it came from (a mirror, or the registry)
	digest string
	image  v1.Image
}

// resolve fetches ref's manifest (for a manifest list, the linux entry of
// the host's architecture) from the first candidate that has it.
func (r Config) resolve(ctx context.Context, ref name.Reference) (pulled, error) {
	cands, err := r.candidates(ref)
	if err != nil {
		return pulled{}, err
	}
	keychain := r.Keychain
	if keychain == nil {
		keychain = authn.DefaultKeychain
	}
	if r.Logins != nil {
		keychain = authn.NewMultiKeychain(r.Logins, keychain)
	}
	opts := []remote.Option{
		remote.WithContext(ctx),
		remote.WithAuthFromKeychain(keychain),
		remote.WithPlatform(v1.Platform{OS: "linux", Architecture: runtime.GOARCH}),
	}
	if r.Transport != nil {
		opts = append(opts, remote.WithTransport(r.Transport))
	}
	var errs []error
	for _, c := range cands {
		desc, err := remote.Get(c, opts...)
		if err == nil {
			var img v1.Image
			if img, err = desc.Image(); err == nil {
				return pulled{from: c, digest: desc.Digest.String(), image: img}, nil
			}
		}
		errs = append(errs, registryError(c, err))
	}
	// The registry's own answer classifies; a mirror's failure is context.
	last := errs[len(errs)-1]
	if len(errs) > 1 {
		return pulled{}, fmt.Errorf("%w (mirror: %v)", last, errs[0])
	}
	return pulled{}, last
}

// registryError classifies an error talking to the registry of ref:
// unknown image -> not found; refused credentials -> permission denied;
// unreachable or failing registry -> unavailable; each naming the registry.
func registryError(ref name.Reference, err error) error {
	reg := ref.Context().RegistryStr()
	if err == nil {
		return nil
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	var terr *transport.Error
	if errors.As(err, &terr) {
		for _, d := range terr.Errors {
			switch d.Code {
			case transport.ManifestUnknownErrorCode, transport.NameUnknownErrorCode, transport.BlobUnknownErrorCode:
				return fmt.Errorf("image %s not found in registry %s: %v: %w", ref, reg, err, errdefs.ErrNotFound)
			case transport.UnauthorizedErrorCode:
				return fmt.Errorf("registry %s wants credentials for %s (none given, or refused): log in with `berth registry login %s` (~/.docker/config.json is read too): %v: %w", reg, ref, reg, err, errdefs.ErrUnauthenticated)
			case transport.DeniedErrorCode:
				return fmt.Errorf("registry %s denied access to %s with the credentials given: %v: %w", reg, ref, err, errdefs.ErrPermissionDenied)
			}
		}
		switch {
		case terr.StatusCode == http.StatusNotFound:
			return fmt.Errorf("image %s not found in registry %s: %w", ref, reg, errdefs.ErrNotFound)
		case terr.StatusCode == http.StatusUnauthorized:
			return fmt.Errorf("registry %s wants credentials for %s (none given, or refused): log in with `berth registry login %s`: %v: %w", reg, ref, reg, err, errdefs.ErrUnauthenticated)
		case terr.StatusCode == http.StatusForbidden:
			return fmt.Errorf("registry %s denied access to %s: %v: %w", reg, ref, err, errdefs.ErrPermissionDenied)
		case terr.StatusCode >= 500 || terr.StatusCode == http.StatusTooManyRequests:
			return fmt.Errorf("registry %s failed: %v: %w", reg, err, errdefs.ErrUnavailable)
		}
		return fmt.Errorf("registry %s: %v: %w", reg, err, errdefs.ErrFailedPrecondition)
	}
	if strings.Contains(err.Error(), "no child with platform") {
		return fmt.Errorf("image %s has no linux/%s variant: %v: %w", ref, runtime.GOARCH, err, errdefs.ErrNotFound)
	}
	var nerr net.Error
	var operr *net.OpError
	var dnserr *net.DNSError
	var uerr *url.Error
	if errors.As(err, &operr) || errors.As(err, &dnserr) || errors.As(err, &nerr) || errors.As(err, &uerr) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) {
		return fmt.Errorf("registry %s is unreachable: %v: %w", reg, err, errdefs.ErrUnavailable)
	}
	return fmt.Errorf("registry %s: %v: %w", reg, err, errdefs.ErrUnavailable)
}
