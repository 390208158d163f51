package sandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strings"

	"golang.org/x/sync/errgroup"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/audit"
	"github.com/berth-sandbox/berth/internal/policy"
)

// Egress is what the Manager needs from the host-side egress services
// (egress.Egress): per-sandbox resolver, proxy, policy and CA.
type Egress interface {
	// Prepare makes the sandbox's egress state and returns its CA
	// certificate (PEM), which the sandbox must trust.
	Prepare(id string) ([]byte, error)
	// CA is the sandbox's CA certificate and key (PEM), ErrNotFound
	// before Prepare; AdoptCA makes such a pair another sandbox's CA,
	// before its Prepare (memcopy.go: a memory image's processes trust
	// their source's CA).
	CA(id string) (certPEM, keyPEM []byte, err error)
	AdoptCA(id string, certPEM, keyPEM []byte) error
	Start(ctx context.Context, id string, hostIP netip.Addr, p policy.Policy) error
	SetPolicy(id string, p policy.Policy) error
	Policy(id string) (policy.Policy, error)
	LoadPolicy(id string) (policy.Policy, error)
	Remove(id string) error
	// Stop closes the sandbox's resolver and proxy, keeping its state
	// (policy, CA) for a Start after a resume.
	Stop(id string)
	List() ([]string, error)
	// ResolvConf is the sandbox's resolv.conf, naming its resolver on
	// hostIP.
	ResolvConf(hostIP netip.Addr) []byte
}

// AgentFiles reads and writes files in a sandbox through its agent
// (agentlink.Link): the Manager installs the egress CA and resolver with
// it.
type AgentFiles interface {
	ReadFile(ctx context.Context, addr, token, path string, max int64) ([]byte, error)
	WriteFile(ctx context.Context, addr, token, path string, r io.Reader) error
}

// AuditLog is the egress decision record.
type AuditLog interface {
	Read(id string, f audit.Filter) ([]audit.Record, error)
	Follow(ctx context.Context, id string, f audit.Filter, fn func(audit.Record) error) error
}

// modeSetter is the Network's firewall side of a policy.
type modeSetter interface {
	SetMode(ctx context.Context, id string, mode policy.Mode) error
}

// Where the sandbox finds its egress CA (installEgress writes them): the
// CA alone, in Debian's local trust store, and appended to the system
// bundle (what OpenSSL-, Python-, git- and Go-based clients read through
// SSL_CERT_FILE and friends; see egressEnv).
const (
	egressCAPath       = "/etc/berth/egress-ca.pem"
	egressBundlePath   = "/etc/berth/ca-bundle.pem"
	egressDebianCAPath = "/usr/local/share/ca-certificates/berth-egress.crt"
	systemBundlePath   = "/etc/ssl/certs/ca-certificates.crt"
	resolvConfPath     = "/etc/resolv.conf"
	// maxSystemBundle bounds the system bundle read back from the
	// sandbox (Debian's is about 200 KiB); the agent is not trusted.
	maxSystemBundle = 8 << 20
)

// egressEnv points TLS clients at the bundle holding the sandbox's CA,
// unless the request set the variable itself.
func (m *Manager) egressEnv(env []string) []string {
	if m.deps.Egress == nil {
		return env
	}
	vars := []string{
		"SSL_CERT_FILE=" + egressBundlePath,
		"REQUESTS_CA_BUNDLE=" + egressBundlePath,
		"CURL_CA_BUNDLE=" + egressBundlePath,
		"GIT_SSL_CAINFO=" + egressBundlePath,
		"NODE_EXTRA_CA_CERTS=" + egressCAPath,
	}
next:
	for _, v := range vars {
		key := v[:strings.IndexByte(v, '=')+1]
		for _, have := range env {
			if strings.HasPrefix(have, key) {
				continue next
			}
		}
		env = append(env, v)
	}
	return env
}

// policyField turns a policy validation error into a FieldError naming
// the entry ("network.allow[2]").
func policyField(err error) error {
	var re *policy.RuleError
	if errors.As(err, &re) {
		return &FieldError{Field: "network." + re.Field, Err: err}
	}
	var ce *policy.CeilingError
	if errors.As(err, &ce) {
		return &FieldError{Field: "network." + ce.Field, Err: err}
	}
	return &FieldError{Field: "network", Err: err}
}

// checkPolicy validates p and refuses what it names outside the
// operator's egress ceiling, naming the entry ("network.allow[1]").
func (m *Manager) checkPolicy(p policy.Policy) error {
	if err := p.Validate(); err != nil {
		return policyField(err)
	}
	if err := m.cfg.Ceiling.Check(p); err != nil {
		return policyField(err)
	}
	return nil
}

// startEgress applies p to a sandbox whose agent answers: its resolver
// and proxy, its firewall mode, and its resolv.conf and trust store.
func (m *Manager) startEgress(ctx context.Context, e *entry, p policy.Policy, install bool) error {
	ca, err := m.prepareEgress(ctx, e, p)
	if err != nil || !install {
		return err
	}
	return m.installEgress(ctx, e, ca)
}

// prepareEgress makes the sandbox's CA, starts its resolver and proxy and
// sets its firewall mode: everything that needs the network attachment but
// not the agent, so create runs it while the agent starts.
func (m *Manager) prepareEgress(ctx context.Context, e *entry, p policy.Policy) (ca []byte, err error) {
	if m.deps.Egress == nil {
		if p.Mode != "" && p.Mode != policy.ModeNone {
			return nil, fmt.Errorf("egress policy %s: this daemon has no egress services: %w", p.Mode, errdefs.ErrFailedPrecondition)
		}
		return nil, nil
	}
	ca, err = m.deps.Egress.Prepare(e.rec.ID)
	if err != nil {
		return nil, err
	}
	if err := m.deps.Egress.Start(ctx, e.rec.ID, e.att.HostIP, p); err != nil {
		return nil, err
	}
	if ms, ok := m.deps.Network.(modeSetter); ok {
		if err := ms.SetMode(ctx, e.rec.ID, p.Normalize().Mode); err != nil {
			return nil, err
		}
	}
	return ca, nil
}

// egressFile is one file of a sandbox's egress settings.
type egressFile struct {
	path string
	body []byte
}

// egressFiles are sandbox e's resolver settings and CA files; read reads
// a file of the sandbox (its system CA bundle, which the sandbox's own
// bundle extends with ca).
func (m *Manager) egressFiles(e *entry, ca []byte, read func(path string, max int64) ([]byte, error)) []egressFile {
	// Without a system bundle (a template without ca-certificates) the
	// bundle is the sandbox's CA alone.
	bundle, err := read(systemBundlePath, maxSystemBundle)
	if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		m.log.Warn("system_ca_bundle_unreadable", "sandbox_id", e.rec.ID, "err", err)
		bundle = nil
	}
	if len(bundle) > 0 && !bytes.HasSuffix(bundle, []byte("\n")) {
		bundle = append(bundle, '\n')
	}
	return []egressFile{
		{resolvConfPath, m.deps.Egress.ResolvConf(e.att.HostIP)},
		{egressCAPath, ca},
		{egressDebianCAPath, ca},
		{egressBundlePath, append(bundle, ca...)},
	}
}

// installEgress writes the resolver settings and the CA into the sandbox
// through its agent.
func (m *Manager) installEgress(ctx context.Context, e *entry, ca []byte) error {
	if m.deps.Egress == nil {
		return nil
	}
	addr, token := agentAddr(e.att), e.rec.Token
	files := m.egressFiles(e, ca, func(path string, max int64) ([]byte, error) {
		return m.deps.Files.ReadFile(ctx, addr, token, path, max)
	})
	// Independent files: written at once, one round trip to the agent
	// instead of four in a row.
	g, gctx := errgroup.WithContext(ctx)
	for _, f := range files {
		g.Go(func() error {
			if err := m.deps.Files.WriteFile(gctx, addr, token, f.path, bytes.NewReader(f.body)); err != nil {
				return fmt.Errorf("install egress settings: %w", err)
			}
			return nil
		})
	}
	return g.Wait()
}

// installEgressFromHost writes sandbox e's resolver settings and a fresh
// CA into its root filesystem from the host (RootWriter), as a create's
// BeforeStart hook does once the network is attached: the agent, starting
// meanwhile, then answers a sandbox that has them, and the create saves
// the agent round trips of installEgress. It reports whether it did (the
// daemon has egress services and the runtime can).
func (m *Manager) installEgressFromHost(rt Runtime, e *entry) (bool, error) {
	rw, ok := rt.(RootWriter)
	if m.deps.Egress == nil || !ok {
		return false, nil
	}
	ca, err := m.deps.Egress.Prepare(e.rec.ID)
	if err != nil {
		return false, err
	}
	files := m.egressFiles(e, ca, func(path string, max int64) ([]byte, error) {
		return rw.ReadRootFile(e.id, path, max)
	})
	for _, f := range files {
		if err := rw.WriteRootFile(e.id, f.path, f.body); err != nil {
			return false, fmt.Errorf("install egress settings: %w", err)
		}
	}
	return true, nil
}

// removeEgress drops the sandbox's egress services and state (CA key).
func (m *Manager) removeEgress(id string) error {
	if m.deps.Egress == nil {
		return nil
	}
	return m.deps.Egress.Remove(id)
}

// readoptEgress restarts an adopted sandbox's resolver and proxy with its
// persisted policy and rewrites its firewall mode.
func (m *Manager) readoptEgress(ctx context.Context, e *entry) error {
	if m.deps.Egress == nil {
		return nil
	}
	p, err := m.deps.Egress.LoadPolicy(e.rec.ID)
	if errors.Is(err, errdefs.ErrNotFound) {
		p = policy.Policy{Mode: policy.ModeNone}
	} else if err != nil {
		return err
	}
	return m.startEgress(ctx, e, p, false)
}

// readyEntry returns a live, ready sandbox's entry (op not held).
func (m *Manager) readyEntry(ctx context.Context, id string) (*entry, error) {
	e, ok := m.lookup(id)
	if !ok {
		if _, err := m.deps.Store.GetSandbox(ctx, id); err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("sandbox %s is not running: %w", id, errdefs.ErrFailedPrecondition)
	}
	return e, nil
}

// NetworkPolicy returns a running sandbox's egress policy.
func (m *Manager) NetworkPolicy(ctx context.Context, id string) (policy.Policy, error) {
	e, err := m.readyEntry(ctx, id)
	if err != nil {
		return policy.Policy{}, err
	}
	if m.deps.Egress == nil {
		return policy.Policy{Mode: policy.ModeNone}, nil
	}
	if st := e.cur.Load().state; st == StatePaused {
		// Its services are stopped; the policy it keeps is on disk.
		p, err := m.deps.Egress.LoadPolicy(id)
		if errors.Is(err, errdefs.ErrNotFound) {
			return policy.Policy{Mode: policy.ModeNone}, nil
		}
		return p, err
	}
	return m.deps.Egress.Policy(id)
}

// SetNetworkPolicy replaces a running sandbox's egress policy; it applies
// at once, and closes open connections it refuses (a kill switch). An
// invalid policy changes nothing.
func (m *Manager) SetNetworkPolicy(ctx context.Context, id string, p policy.Policy) (policy.Policy, error) {
	if err := m.checkPolicy(p); err != nil {
		return policy.Policy{}, err
	}
	p = p.Normalize()
	e, err := m.readyEntry(ctx, id)
	if err != nil {
		return policy.Policy{}, err
	}
	if err := e.lock(ctx); err != nil {
		return policy.Policy{}, err
	}
	defer e.unlock()
	if e.closed || e.state() != StateReady {
		return policy.Policy{}, fmt.Errorf("sandbox %s is %s: %w", id, e.rec.State, errdefs.ErrFailedPrecondition)
	}
	if m.deps.Egress == nil {
		return policy.Policy{}, fmt.Errorf("this daemon has no egress services: %w", errdefs.ErrFailedPrecondition)
	}
	if err := m.applyPolicy(ctx, id, p); err != nil {
		return policy.Policy{}, err
	}
	m.event(ctx, id, EventNetworkPolicy, "egress policy "+string(p.Mode))
	return p, nil
}

// applyPolicy switches a live sandbox's egress policy; the caller holds
// its op lock and has validated and normalised p.
func (m *Manager) applyPolicy(ctx context.Context, id string, p policy.Policy) error {
	if m.deps.Egress == nil {
		if p.Mode == policy.ModeNone {
			return nil
		}
		return fmt.Errorf("this daemon has no egress services: %w", errdefs.ErrFailedPrecondition)
	}
	old, err := m.deps.Egress.Policy(id)
	if err != nil {
		return err
	}
	// Firewall first when opening, proxy first when closing, so neither
	// step is ever more open than both policies.
	ms, _ := m.deps.Network.(modeSetter)
	closing := p.Mode == policy.ModeNone
	if closing {
		if ms != nil {
			if err := ms.SetMode(ctx, id, p.Mode); err != nil {
				return err
			}
		}
		return m.deps.Egress.SetPolicy(id, p)
	}
	if err := m.deps.Egress.SetPolicy(id, p); err != nil {
		return err
	}
	if ms != nil {
		if err := ms.SetMode(ctx, id, p.Mode); err != nil {
			if rerr := m.deps.Egress.SetPolicy(id, old); rerr != nil {
				// The proxy keeps the new policy, the firewall the old;
				// traffic needs both, so the sandbox is no more open
				// than before, but the two now disagree.
				m.log.Error("policy_rollback_failed", "sandbox_id", id, "err", rerr)
			}
			return err
		}
	}
	return nil
}

// EventNetworkPolicy records a policy change.
const EventNetworkPolicy = "network_policy"

// NetworkLog returns a sandbox's egress decisions (also after it ended).
func (m *Manager) NetworkLog(ctx context.Context, id string, f audit.Filter) ([]audit.Record, error) {
	if _, err := m.deps.Store.GetSandbox(ctx, id); err != nil {
		return nil, err
	}
	if m.deps.Audit == nil {
		return nil, nil
	}
	return m.deps.Audit.Read(id, f)
}

// FollowNetworkLog streams a sandbox's egress decisions until ctx ends.
func (m *Manager) FollowNetworkLog(ctx context.Context, id string, f audit.Filter, fn func(audit.Record) error) error {
	if _, err := m.deps.Store.GetSandbox(ctx, id); err != nil {
		return err
	}
	if m.deps.Audit == nil {
		<-ctx.Done()
		return nil
	}
	return m.deps.Audit.Follow(ctx, id, f, fn)
}

// SuggestPolicy proposes the smallest allow policy covering what the
// sandbox was denied.
func (m *Manager) SuggestPolicy(ctx context.Context, id string) (policy.Policy, error) {
	recs, err := m.NetworkLog(ctx, id, audit.Filter{DeniedOnly: true})
	if err != nil {
		return policy.Policy{}, err
	}
	return policy.Suggest(recs), nil
}
