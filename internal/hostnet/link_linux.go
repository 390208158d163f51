package hostnet

import (
	"crypto/sha256"
	"encoding/base32"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/berth-sandbox/berth/errdefs"
)

const (
	maxIfaceLen = 15 // IFNAMSIZ - 1
	// maxNameAttempts bounds the re-hashing when a derived host link name
	// is taken (a hash collision between two ids).
	maxNameAttempts = 8
	sandboxIface    = "eth0"
)

// naming derives every kernel object name of one instance. The prefixes
// end in a character instances cannot contain, so no instance's prefix is
// a prefix of another's ("ba-" vs "bab-").
type naming struct {
	instance    string
	table       string // nftables table, family inet
	linkPrefix  string // host-side veth names
	netnsPrefix string // netns file names
	aliasPrefix string // IFLA_IFALIAS of host-side veths, followed by the id
}

func newNaming(instance string) naming {
	return naming{
		instance:    instance,
		table:       "berth_" + instance,
		linkPrefix:  "b" + instance + "-",
		netnsPrefix: "berth-" + instance + "-",
		aliasPrefix: "berth/" + instance + "/",
	}
}

var b32 = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// link is the host-side veth name for id: the prefix, then as many base32
// characters of a hash of the id as fit in 15 (at least 5, i.e. 25 bits).
// attempt > 0 picks another hash when the first name is taken.
func (nm naming) link(id string, attempt int) string {
	sum := sha256.Sum256(fmt.Appendf(nil, "%s\x00%d", id, attempt))
	return nm.linkPrefix + b32.EncodeToString(sum[:])[:maxIfaceLen-len(nm.linkPrefix)]
}

func (nm naming) alias(id string) string { return nm.aliasPrefix + id }

// chain is the sandbox's nftables chain. Chain names may hold 255 bytes, so
// the id fits whole and List can read it back even when the link is gone.
func (nm naming) chain(id string) string { return chainPrefix + id }

func (nm naming) idFromChain(chain string) (string, bool) { return cutPrefix(chain, chainPrefix) }

const chainPrefix = "sbx-"

// ownLinks maps sandbox ids to this instance's host-side links. A link with
// our prefix but no alias (should not happen: the alias is set in the same
// message that creates the link) is keyed by its name so it is not lost.
func (n *Network) ownLinks() (map[string]netlink.Link, error) {
	links, err := dump(netlink.LinkList)
	if err != nil {
		return nil, fmt.Errorf("list links: %w", err)
	}
	out := map[string]netlink.Link{}
	for _, l := range links {
		a := l.Attrs()
		if !strings.HasPrefix(a.Name, n.names.linkPrefix) {
			continue
		}
		if id, ok := cutPrefix(a.Alias, n.names.aliasPrefix); ok {
			out[id] = l
		}
	}
	return out, nil
}

// findLink returns id's host link, or nil if there is none. The link can
// only carry one of the names createLink derives for id (the first of
// them free when it was made), so asking for those few by name replaces a
// dump of every link on the host, which grows with every sandbox of every
// daemon and ran once per create (the leftover check).
func (n *Network) findLink(id string) (netlink.Link, error) {
	for attempt := range maxNameAttempts {
		l, err := netlink.LinkByName(n.names.link(id, attempt))
		var nf netlink.LinkNotFoundError
		switch {
		case errors.As(err, &nf) || errors.Is(err, unix.ENODEV):
			continue // a lower name may have been freed since: look on
		case err != nil:
			return nil, fmt.Errorf("link of %s: %w", id, err)
		case l.Attrs().Alias == n.names.alias(id):
			return l, nil
		}
	}
	return nil, nil
}

// createLink creates the veth pair for the /30 reserved for it
// (reserve_linux.go; the only step under the host-wide lock): the host
// side named from the id and aliased with it, the sandbox side created
// straight inside the netns as eth0.
func (n *Network) createLink(att *Attachment, prefix netip.Prefix) error {
	ns, err := netns.GetFromPath(att.NetNSPath)
	if err != nil {
		return fmt.Errorf("open netns: %w", err)
	}
	defer ns.Close()
	var name string
	for attempt := 0; ; attempt++ {
		name = n.names.link(att.ID, attempt)
		veth := &netlink.Veth{
			LinkAttrs: netlink.LinkAttrs{
				Name:  name,
				Alias: n.names.alias(att.ID),
			},
			PeerName:      sandboxIface,
			PeerNamespace: netlink.NsFd(ns),
		}
		err = netlink.LinkAdd(veth)
		if err == nil {
			break
		}
		if !errors.Is(err, unix.EEXIST) || attempt+1 >= maxNameAttempts {
			return fmt.Errorf("create veth %s: %w", name, err)
		}
	}
	att.HostIface = name
	link, err := netlink.LinkByName(name)
	if err != nil {
		return fmt.Errorf("veth %s: %w", name, err)
	}
	if link.Attrs().Alias != n.names.alias(att.ID) {
		// Kernels that ignore IFLA_IFALIAS on creation.
		if err := netlink.LinkSetAlias(link, n.names.alias(att.ID)); err != nil {
			return fmt.Errorf("alias veth %s: %w", name, err)
		}
	}
	// Per-interface knobs only; the host's global settings stay as they are.
	// No IPv6 on the host side either (nothing to talk to over it), and ARP
	// replies only for the address on this link, so a sandbox cannot probe
	// which other addresses the host has.
	for _, s := range []struct{ path, value string }{
		{"net/ipv6/conf/" + name + "/disable_ipv6", "1"},
		{"net/ipv4/conf/" + name + "/arp_ignore", "1"},
	} {
		if err := writeSysctl(s.path, s.value); err != nil {
			return err
		}
	}
	att.HostIP = prefix.Addr().Next()
	att.SandboxIP = att.HostIP.Next()
	addr := &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(att.HostIP, prefix.Bits()))}
	if err := netlink.AddrAdd(link, addr); err != nil {
		return fmt.Errorf("address %s on %s: %w", addr, name, err)
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return fmt.Errorf("veth %s up: %w", name, err)
	}
	return nil
}

// configureSandboxSide gives eth0 the sandbox address and a default route
// via the host side. eth0 has IPv6 off already: it was made in the
// sandbox's namespace after configureNetns turned it off for every new
// interface there (net/ipv6/conf/default).
func configureSandboxSide(att Attachment) error {
	h, err := handleAt(att.NetNSPath)
	if err != nil {
		return err
	}
	defer h.Close()
	eth, err := h.LinkByName(sandboxIface)
	if err != nil {
		return fmt.Errorf("sandbox %s: %w", sandboxIface, err)
	}
	addr := &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(att.SandboxIP, 30))}
	if err := h.AddrAdd(eth, addr); err != nil {
		return fmt.Errorf("sandbox address %s: %w", addr, err)
	}
	if err := h.LinkSetUp(eth); err != nil {
		return fmt.Errorf("sandbox %s up: %w", sandboxIface, err)
	}
	route := &netlink.Route{LinkIndex: eth.Attrs().Index, Gw: net.IP(att.HostIP.AsSlice())}
	if err := h.RouteAdd(route); err != nil {
		return fmt.Errorf("sandbox default route via %s: %w", att.HostIP, err)
	}
	// Permanent neighbour entries on both ends: the pair is point to
	// point and both MACs are known, so ARP is skipped. This saves the
	// first packets of every sandbox a resolution round (seen to stall a
	// fresh veth's first connection for a whole ARP retry second) and
	// leaves a sandbox nothing to learn or poison.
	host, err := netlink.LinkByName(att.HostIface)
	if err != nil {
		return fmt.Errorf("host %s: %w", att.HostIface, err)
	}
	if err := h.NeighSet(&netlink.Neigh{LinkIndex: eth.Attrs().Index, Family: netlink.FAMILY_V4, State: netlink.NUD_PERMANENT,
		IP: net.IP(att.HostIP.AsSlice()), HardwareAddr: host.Attrs().HardwareAddr}); err != nil {
		return fmt.Errorf("sandbox neighbour %s: %w", att.HostIP, err)
	}
	if err := netlink.NeighSet(&netlink.Neigh{LinkIndex: host.Attrs().Index, Family: netlink.FAMILY_V4, State: netlink.NUD_PERMANENT,
		IP: net.IP(att.SandboxIP.AsSlice()), HardwareAddr: eth.Attrs().HardwareAddr}); err != nil {
		return fmt.Errorf("host neighbour %s: %w", att.SandboxIP, err)
	}
	return nil
}

func deleteLink(l netlink.Link) error {
	// Deleting one end of a veth deletes its peer in the netns too.
	if err := netlink.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("delete link %s: %w", l.Attrs().Name, err)
	}
	return nil
}

// hostAddr returns the link's IPv4 address inside pool; ok is false if it
// has none. Failing to read the addresses is an error, not "none": under
// concurrent creates that difference was a spurious "link has no address".
func hostAddr(l netlink.Link, pool netip.Prefix) (ip netip.Addr, ok bool, err error) {
	addrs, err := dump(func() ([]netlink.Addr, error) { return netlink.AddrList(l, netlink.FAMILY_V4) })
	if err != nil {
		return netip.Addr{}, false, fmt.Errorf("addresses of %s: %w", l.Attrs().Name, err)
	}
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP.To4())
		if ok && pool.Contains(ip) {
			return ip, true, nil
		}
	}
	return netip.Addr{}, false, nil
}

// dumpAttempts bounds the retries of an interrupted netlink dump. Each
// retry is a fresh dump; an interruption means only that the table changed
// while the kernel was writing it (another sandbox's link or address came
// or went), which with many concurrent creates happens often but rarely
// many times in a row.
const dumpAttempts = 20

// dump runs a netlink dump again while the kernel reports it interrupted
// (NLM_F_DUMP_INTR: "results may be incomplete or inconsistent"). Those
// results are never used: a missing entry would read as "no such link" or
// "address free".
func dump[T any](f func() (T, error)) (T, error) {
	var (
		out T
		err error
	)
	for range dumpAttempts {
		out, err = f()
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			return out, err
		}
	}
	var zero T
	return zero, fmt.Errorf("netlink dump interrupted %d times in a row: %w", dumpAttempts, errdefs.ErrUnavailable)
}

// preferred is the /30 holding addr, when it is in the pool and free.
func preferred(pool netip.Prefix, addr netip.Addr, used []netip.Prefix) (netip.Prefix, bool) {
	if !addr.Is4() || !pool.Contains(addr) {
		return netip.Prefix{}, false
	}
	cand := netip.PrefixFrom(addr, 30).Masked()
	for _, u := range used {
		if u.Overlaps(cand) {
			return netip.Prefix{}, false
		}
	}
	return cand, true
}

// allocateFrom picks a /30 of pool that overlaps nothing in used. The
// scan starts at a slot derived from the id, so a just-freed /30 is not
// immediately handed to the next sandbox.
func allocateFrom(pool netip.Prefix, id string, used []netip.Prefix) (netip.Prefix, error) {
	slots := uint32(1) << (30 - pool.Bits())
	base := ipv4ToUint(pool.Addr())
	sum := sha256.Sum256([]byte(id))
	start := (uint32(sum[0])<<24 | uint32(sum[1])<<16 | uint32(sum[2])<<8 | uint32(sum[3])) % slots
	for i := uint32(0); i < slots; i++ {
		slot := (start + i) % slots
		cand := netip.PrefixFrom(uintToIPv4(base+slot*4), 30)
		free := true
		for _, u := range used {
			if u.Overlaps(cand) {
				free = false
				break
			}
		}
		if free {
			return cand, nil
		}
	}
	return netip.Prefix{}, fmt.Errorf("address pool %s: %w", pool, errdefs.ErrResourceExhausted)
}

func usedPrefixes() ([]netip.Prefix, error) {
	var used []netip.Prefix
	addrs, err := dump(func() ([]netlink.Addr, error) { return netlink.AddrList(nil, netlink.FAMILY_V4) })
	if err != nil {
		return nil, fmt.Errorf("list host addresses: %w", err)
	}
	for _, a := range addrs {
		if p, ok := toPrefix(a.IPNet); ok {
			used = append(used, p.Masked())
		}
	}
	// Every table, not only main: a policy-routing table may send part of
	// the pool somewhere else.
	routes, err := dump(func() ([]netlink.Route, error) {
		return netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
	})
	if err != nil {
		return nil, fmt.Errorf("list host routes: %w", err)
	}
	for _, r := range routes {
		if p, ok := toPrefix(r.Dst); ok && p.Bits() > 0 {
			used = append(used, p.Masked())
		}
	}
	return used, nil
}

func toPrefix(n *net.IPNet) (netip.Prefix, bool) {
	if n == nil {
		return netip.Prefix{}, false
	}
	ip, ok := netip.AddrFromSlice(n.IP.To4())
	if !ok {
		return netip.Prefix{}, false
	}
	ones, bits := n.Mask.Size()
	if bits != 32 {
		return netip.Prefix{}, false
	}
	return netip.PrefixFrom(ip, ones), true
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

func ipv4ToUint(a netip.Addr) uint32 {
	b := a.As4()
	return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
}

func uintToIPv4(v uint32) netip.Addr {
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}
