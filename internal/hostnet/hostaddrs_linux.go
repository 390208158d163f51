package hostnet

import (
	"net/netip"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
)

// HostAddrs reads the host's own addresses (every interface of the
// daemon's network namespace) for policy.Guard, which forbids them. Reads
// are cached for a second: the guard asks on every connection and DNS
// answer.
type HostAddrs struct {
	mu      sync.Mutex
	cached  []netip.Addr
	fetched time.Time
}

// List returns the host's addresses. When the kernel cannot be read it
// returns the last list it read.
func (h *HostAddrs) List() []netip.Addr {
	h.mu.Lock()
	defer h.mu.Unlock()
	if time.Since(h.fetched) < time.Second && h.cached != nil {
		return h.cached
	}
	addrs, err := dump(func() ([]netlink.Addr, error) { return netlink.AddrList(nil, netlink.FAMILY_ALL) })
	if err != nil {
		return h.cached // keep the last good list
	}
	out := make([]netip.Addr, 0, len(addrs))
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			out = append(out, ip.Unmap())
		}
	}
	h.cached, h.fetched = out, time.Now()
	return out
}
