package hostnet

import (
	"context"
	"errors"
	"fmt"
	"github.com/berth-sandbox/berth/api/types"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/policy"
)

// Network manages the sandboxes' networks of one daemon instance.
type Network struct {
	cfg   Config
	log   *slog.Logger
	names naming
	fw    *firewall

	// mu is held shared by per-sandbox calls and exclusively by Teardown;
	// ids serialises calls for one sandbox. Different sandboxes attach in
	// parallel; the host-wide flock serialises only address allocation.
	mu  sync.RWMutex
	ids idLocks

	// failpoint, when set (tests only), is called after each Attach step and
	// its error aborts the Attach, to exercise the rollback.
	failpoint func(step string) error
}

var (
	instanceRE = regexp.MustCompile(`^[a-z0-9]{1,8}$`)
)

// New validates cfg and sets up this instance's nftables table and base
// chains. It is idempotent: running it again (a daemon restart) rewrites the
// base chains atomically and keeps per-sandbox entries.
func New(ctx context.Context, cfg Config) (*Network, error) {
	if !instanceRE.MatchString(cfg.Instance) {
		return nil, fmt.Errorf("hostnet instance %q must match %s: %w", cfg.Instance, instanceRE, errdefs.ErrInvalidArgument)
	}
	if !cfg.Pool.IsValid() {
		cfg.Pool = DefaultPool
	}
	cfg.Pool = cfg.Pool.Masked()
	if !cfg.Pool.Addr().Is4() || cfg.Pool.Bits() > 30 {
		return nil, fmt.Errorf("hostnet pool %s must be IPv4 and hold at least one /30: %w", cfg.Pool, errdefs.ErrInvalidArgument)
	}
	if cfg.NetnsDir == "" {
		cfg.NetnsDir = DefaultNetnsDir
	}
	if cfg.LockPath == "" {
		cfg.LockPath = DefaultLockPath
	}
	if cfg.ReserveDir == "" {
		cfg.ReserveDir = cfg.LockPath + ".d"
	}
	if cfg.ProxyPort == 0 {
		cfg.ProxyPort = DefaultProxyPort
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	n := &Network{
		cfg:   cfg,
		log:   cfg.Logger.With("hostnet_instance", cfg.Instance),
		names: newNaming(cfg.Instance),
	}
	n.fw = &firewall{table: n.names.table, ifacePrefix: n.names.linkPrefix, proxyPort: cfg.ProxyPort, logGroup: cfg.LogGroup, ceilingDeny: cfg.CeilingDeny}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := prepareNetnsDir(cfg.NetnsDir); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(cfg.LockPath), 0o755); err != nil {
		return nil, fmt.Errorf("hostnet lock dir: %w", err)
	}
	if err := os.MkdirAll(cfg.ReserveDir, 0o700); err != nil {
		return nil, fmt.Errorf("hostnet reservation dir: %w", err)
	}
	if err := n.fw.setup(); err != nil {
		return nil, fmt.Errorf("hostnet firewall setup: %w", err)
	}
	return n, nil
}

// TableName is the nftables table (family inet) this instance owns.
func (n *Network) TableName() string { return n.names.table }

// SandboxChain is the nftables chain (in TableName) that decides what the
// sandbox's packets may do. The base chains jump to it for every packet
// entering the host from the sandbox's veth and drop whatever it returns
// without a verdict; policy adds accepts to it.
func (n *Network) SandboxChain(id string) string { return n.names.chain(id) }

// NetnsPath is where the sandbox's netns file lives (whether or not it exists).
func (n *Network) NetnsPath(id string) string {
	return filepath.Join(n.cfg.NetnsDir, n.names.netnsPrefix+id)
}

// Attach creates the sandbox's network: netns, veth pair, addresses, routes,
// sysctls and firewall entries. On any failure it undoes everything it made.
// Attaching an id that already has any leftover fails with ErrAlreadyExists.
func (n *Network) Attach(ctx context.Context, id string) (att Attachment, err error) {
	return n.AttachTo(ctx, id, "")
}

// AttachTo is Attach into an existing network namespace: nsSource (for
// example /proc/<pid>/ns/net of a sandbox's init) is bind-mounted at the
// sandbox's netns path, so it outlives the daemon and Lookup finds it after
// a restart. An empty nsSource creates a new namespace.
func (n *Network) AttachTo(ctx context.Context, id, nsSource string) (att Attachment, err error) {
	return n.AttachToAt(ctx, id, nsSource, netip.Addr{})
}

// AttachToAt is AttachTo that gives the sandbox address addr again (its
// /30) when that is free on the host, as a resumed sandbox had it; taken
// or invalid, the sandbox gets an address as AttachTo gives one.
func (n *Network) AttachToAt(ctx context.Context, id, nsSource string, addr netip.Addr) (att Attachment, err error) {
	if err := validID(id); err != nil {
		return Attachment{}, err
	}
	defer n.lockID(id)()
	checkStart := time.Now()
	if present, err := n.anyLeftover(id); err != nil {
		return Attachment{}, err
	} else if present {
		return Attachment{}, fmt.Errorf("sandbox %s network: %w", id, errdefs.ErrAlreadyExists)
	}
	defer func() {
		if err == nil {
			return
		}
		// Undo under a context of its own: the caller's may be what failed.
		if derr := n.detach(context.WithoutCancel(ctx), id); derr != nil {
			n.log.Warn("attach_rollback_failed", "sandbox_id", id, "err", derr)
		}
	}()
	att, err = n.attach(ctx, id, nsSource, addr, time.Since(checkStart))
	if err != nil {
		return Attachment{}, fmt.Errorf("attach sandbox %s network: %w", id, err)
	}
	n.log.Debug("sandbox_attached", "sandbox_id", id, "host_iface", att.HostIface, "sandbox_ip", att.SandboxIP)
	return att, nil
}

func (n *Network) step(name string) error {
	if n.failpoint == nil {
		return nil
	}
	return n.failpoint(name)
}

func (n *Network) attach(ctx context.Context, id, nsSource string, prefer netip.Addr, leftoverCheck time.Duration) (Attachment, error) {
	att := Attachment{ID: id, NetNSPath: n.NetnsPath(id)}
	// Each step's duration goes to the debug log (the create path's
	// profile; see the README's Performance section).
	last, phases := time.Now(), append(make([]any, 0, 14), "leftover_check", leftoverCheck)
	step := func(name string) error {
		now := time.Now()
		phases = append(phases, name, now.Sub(last))
		last = now
		return n.step(name)
	}
	if nsSource == "" {
		if err := createNetns(att.NetNSPath); err != nil {
			return att, err
		}
	} else if err := bindNetns(nsSource, att.NetNSPath); err != nil {
		return att, err
	}
	if err := step("netns"); err != nil {
		return att, err
	}
	if err := configureNetns(att.NetNSPath); err != nil {
		return att, err
	}
	if err := step("sysctl"); err != nil {
		return att, err
	}
	if err := ctx.Err(); err != nil {
		return att, err
	}
	prefix, err := n.reserve(ctx, id, prefer)
	if err != nil {
		return att, err
	}
	if err := step("reserve"); err != nil {
		return att, err
	}
	if err := n.createLink(&att, prefix); err != nil {
		return att, err
	}
	if err := step("link"); err != nil {
		return att, err
	}
	if err := configureSandboxSide(att); err != nil {
		return att, err
	}
	if err := step("sandbox_side"); err != nil {
		return att, err
	}
	if err := n.fw.addSandbox(n.names.chain(id), att.HostIface, att.SandboxIP); err != nil {
		return att, fmt.Errorf("firewall: %w", err)
	}
	if err := step("firewall"); err != nil {
		return att, err
	}
	n.log.Debug("attach_phases", append([]any{"sandbox_id", id}, phases...)...)
	return att, nil
}

// SetMode rewrites the sandbox chain's rules for an egress mode (see
// firewall.go): none drops everything new, every other mode lets DNS to
// the sandbox's resolver and TCP to the egress proxy through, which then
// decide per name and address.
func (n *Network) SetMode(ctx context.Context, id string, mode policy.Mode) error {
	if err := validID(id); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	defer n.lockID(id)()
	link, err := n.findLink(id)
	if err != nil {
		return err
	}
	if link == nil {
		return fmt.Errorf("sandbox %s link: %w", id, errdefs.ErrNotFound)
	}
	host, ok, err := hostAddr(link, n.cfg.Pool)
	if err != nil {
		return fmt.Errorf("sandbox %s: %w", id, err)
	}
	if !ok {
		return fmt.Errorf("sandbox %s link has no address: %w", id, errdefs.ErrNotFound)
	}
	if err := n.fw.setPolicy(n.names.chain(id), host.Next(), mode); err != nil {
		return fmt.Errorf("sandbox %s firewall policy: %w", id, err)
	}
	return nil
}

// ProxyPort is the egress proxy's port on each veth's host address.
func (n *Network) ProxyPort() uint16 { return n.cfg.ProxyPort }

// Lookup rebuilds the sandbox's attachment from kernel state, for re-adoption
// after a restart. It returns ErrNotFound unless both the netns file and the
// host link exist. It restores the sandbox's firewall entries if they are
// missing (a flushed table), since without them the host cannot reach the
// sandbox.
func (n *Network) Lookup(ctx context.Context, id string) (Attachment, error) {
	if err := validID(id); err != nil {
		return Attachment{}, err
	}
	if err := ctx.Err(); err != nil {
		return Attachment{}, err
	}
	defer n.lockID(id)()
	att := Attachment{ID: id, NetNSPath: n.NetnsPath(id)}
	if !isNetnsMount(att.NetNSPath) {
		return Attachment{}, fmt.Errorf("sandbox %s netns: %w", id, errdefs.ErrNotFound)
	}
	link, err := n.findLink(id)
	if err != nil {
		return Attachment{}, err
	}
	if link == nil {
		return Attachment{}, fmt.Errorf("sandbox %s link: %w", id, errdefs.ErrNotFound)
	}
	att.HostIface = link.Attrs().Name
	host, ok, err := hostAddr(link, n.cfg.Pool)
	if err != nil {
		return Attachment{}, fmt.Errorf("sandbox %s: %w", id, err)
	}
	if !ok {
		return Attachment{}, fmt.Errorf("sandbox %s link %s has no address in %s: %w", id, att.HostIface, n.cfg.Pool, errdefs.ErrNotFound)
	}
	att.HostIP, att.SandboxIP = host, host.Next()
	if err := n.fw.ensureSandbox(n.names.chain(id), att.HostIface, att.SandboxIP); err != nil {
		return Attachment{}, fmt.Errorf("sandbox %s firewall: %w", id, err)
	}
	return att, nil
}

// Detach removes everything Attach made for id (link, firewall entries,
// netns) and whatever partial leftovers exist. Detaching an unknown id is
// not an error.
func (n *Network) Detach(ctx context.Context, id string) error {
	if err := validID(id); err != nil {
		return err
	}
	defer n.lockID(id)()
	if err := n.detach(ctx, id); err != nil {
		return fmt.Errorf("detach sandbox %s network: %w", id, err)
	}
	return nil
}

func (n *Network) detach(_ context.Context, id string) error {
	var errs []error
	link, err := n.findLink(id)
	linkGone := err == nil
	if err != nil {
		errs = append(errs, err)
	}
	if link != nil {
		if ip, ok, err := hostAddr(link, n.cfg.Pool); err != nil {
			errs = append(errs, err)
		} else if ok {
			// A later sandbox may get this address; stale flows must not
			// make its packets look "established".
			n.flushConntrack(ip.Next())
		}
		if err := deleteLink(link); err != nil {
			errs = append(errs, err)
			linkGone = false
		}
	}
	if err := n.fw.removeSandbox(n.names.chain(id)); err != nil {
		errs = append(errs, fmt.Errorf("firewall: %w", err))
	}
	if err := removeNetns(n.NetnsPath(id)); err != nil {
		errs = append(errs, err)
	}
	// Only once the link is known gone: until then its address is in use.
	if linkGone {
		if err := n.release(id); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// List returns the ids of every sandbox that has any leftover of this
// instance: a netns file, a host link, firewall entries or an address
// reservation.
func (n *Network) List(ctx context.Context) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	ids := map[string]bool{}
	entries, err := os.ReadDir(n.cfg.NetnsDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("list netns dir: %w", err)
	}
	for _, e := range entries {
		if id, ok := cutPrefix(e.Name(), n.names.netnsPrefix); ok {
			ids[id] = true
		}
	}
	links, err := n.ownLinks()
	if err != nil {
		return nil, err
	}
	for id := range links {
		ids[id] = true
	}
	chains, err := n.fw.sandboxChains()
	if err != nil {
		return nil, fmt.Errorf("list firewall chains: %w", err)
	}
	for _, c := range chains {
		if id, ok := n.names.idFromChain(c); ok {
			ids[id] = true
		}
	}
	rs, err := n.reservations()
	if err != nil {
		return nil, err
	}
	for _, r := range rs {
		if r.instance == n.cfg.Instance {
			ids[r.id] = true
		}
	}
	out := make([]string, 0, len(ids))
	for id := range ids {
		out = append(out, id)
	}
	sort.Strings(out)
	return out, nil
}

// Close releases the Network. It leaves the table, links and netns files in
// place so a later New can re-adopt running sandboxes.
func (n *Network) Close(ctx context.Context) error { return nil }

// Teardown deletes this instance's nftables table. It fails with
// ErrFailedPrecondition while any sandbox leftover exists, because removing
// the table would open those sandboxes' veths.
func (n *Network) Teardown(ctx context.Context) error {
	n.mu.Lock() // no Attach can start between the check and the delete
	defer n.mu.Unlock()
	ids, err := n.List(ctx)
	if err != nil {
		return err
	}
	if len(ids) > 0 {
		return fmt.Errorf("hostnet teardown: %d sandboxes still attached: %w", len(ids), errdefs.ErrFailedPrecondition)
	}
	if err := n.fw.teardown(); err != nil {
		return fmt.Errorf("hostnet teardown: %w", err)
	}
	return nil
}

// lockID takes the shared lock and id's own lock, and returns the unlock.
func (n *Network) lockID(id string) func() {
	n.mu.RLock()
	unlock := n.ids.lock(id)
	return func() {
		unlock()
		n.mu.RUnlock()
	}
}

// idLocks is a set of mutexes keyed by sandbox id, dropped when unused.
type idLocks struct {
	mu    sync.Mutex
	locks map[string]*idLock
}

type idLock struct {
	sync.Mutex
	refs int
}

func (l *idLocks) lock(id string) func() {
	l.mu.Lock()
	if l.locks == nil {
		l.locks = map[string]*idLock{}
	}
	e := l.locks[id]
	if e == nil {
		e = &idLock{}
		l.locks[id] = e
	}
	e.refs++
	l.mu.Unlock()
	e.Lock()
	return func() {
		e.Unlock()
		l.mu.Lock()
		if e.refs--; e.refs == 0 {
			delete(l.locks, id)
		}
		l.mu.Unlock()
	}
}

// anyLeftover reports whether id has a netns file, a link, a firewall
// chain or an address reservation.
func (n *Network) anyLeftover(id string) (bool, error) {
	if _, err := os.Lstat(n.NetnsPath(id)); err == nil {
		return true, nil
	}
	link, err := n.findLink(id)
	if err != nil {
		return false, err
	}
	if link != nil {
		return true, nil
	}
	if has, err := n.fw.hasChain(n.names.chain(id)); err != nil || has {
		return has, err
	}
	names, err := n.ownReservations(id)
	return len(names) > 0, err
}

func validID(id string) error { return types.ValidSandboxID(id) }

func cutPrefix(s, prefix string) (string, bool) {
	rest, ok := strings.CutPrefix(s, prefix)
	if !ok || validID(rest) != nil {
		return "", false
	}
	return rest, true
}
