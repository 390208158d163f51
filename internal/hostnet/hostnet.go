// Package hostnet owns each sandbox's host networking: its network
// namespace, the veth pair that links it to the host, the point-to-point
// addresses from a host-wide pool, the host-side nftables table that
// decides what a sandbox may send (nothing in mode none; in every other
// mode only DNS to its resolver and TCP to the egress proxy, which
// decide per name and address), and the NFLOG reader that turns the
// firewall's refusals into audit records.
//
// All state is read back from the kernel (netns files, links and their
// aliases, nftables objects), so a restarted daemon can re-adopt or clean up
// what an earlier run left behind. The code is Linux-only (the _linux.go
// files) and needs root; this file holds what other platforms can name.
// The policy the firewall enforces is package policy; the proxy and
// resolver behind it are package egress.
package hostnet

import (
	"log/slog"
	"net/netip"

	"github.com/berth-sandbox/berth/internal/policy"
)

// Defaults for Config fields left empty.
const (
	DefaultNetnsDir = "/var/run/netns"
	DefaultLockPath = "/run/berth/netpool.lock"
)

// DefaultPool is RFC 2544's benchmarking range: never routed on the
// internet and rarely configured on hosts.
var DefaultPool = netip.MustParsePrefix("198.18.0.0/15")

// Config configures a Network.
type Config struct {
	// Instance is the short name of this daemon, [a-z0-9]{1,8}; it goes into
	// the nftables table name, the host link prefix and the netns prefix, so
	// several daemons can share one host.
	Instance string
	// Pool is where the sandboxes' /30s come from (default DefaultPool).
	// Daemons may share a pool: allocation skips every address already on
	// the host.
	Pool netip.Prefix
	// NetnsDir is where the netns files are bind-mounted (default
	// DefaultNetnsDir, where `ip netns` looks).
	NetnsDir string
	// LockPath is the host-wide lock file held while picking and reserving
	// an address (default DefaultLockPath). Every daemon on a host must use
	// the same one.
	LockPath string
	// ReserveDir holds the address reservations (reserve_linux.go), one
	// file per attached sandbox of every daemon on the host (default
	// LockPath + ".d"). It must be on a tmpfs such as /run, so a reboot
	// forgets them with the links.
	ReserveDir string
	// ProxyPort is where, on each veth's host address, the egress proxy
	// listens; the firewall redirects sandboxes' TCP there (default
	// DefaultProxyPort).
	ProxyPort uint16
	// LogGroup is the NFLOG group the firewall logs its refusals to
	// (DropLog.Group); 0 logs nothing.
	LogGroup uint16
	// CeilingDeny are the operator's egress ceiling's address denials
	// (policy.CompiledCeiling.DenyPrefixes): in
	// every mode that lets anything out, connections to them are refused
	// (and logged with reason "ceiling") before the proxy sees them.
	// IPv4 only: sandboxes have no IPv6.
	CeilingDeny []policy.PortPrefix
	Logger      *slog.Logger
}

// DefaultProxyPort is the egress proxy's port on each veth's host address.
const DefaultProxyPort = 15001

// Attachment describes one sandbox's network as it exists in the kernel.
type Attachment struct {
	ID        string
	NetNSPath string
	HostIface string
	HostIP    netip.Addr
	SandboxIP netip.Addr
}
