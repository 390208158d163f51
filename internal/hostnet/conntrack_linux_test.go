package hostnet

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// TestFlushConntrack puts flows into the host's conntrack table (kernel
// state only: no packet is sent) from and to a sandbox address and
// between two others, flushes the sandbox address, both ways (the
// kernel's filtered flush and the table scan older kernels get), and
// checks that exactly the sandbox's flows are gone.
func TestFlushConntrack(t *testing.T) {
	requireRoot(t)
	if _, err := os.Stat("/proc/sys/net/netfilter/nf_conntrack_count"); err != nil {
		t.Skipf("no conntrack on this host: %v", err)
	}
	sandbox := netip.MustParseAddr("198.51.100.61")
	other := netip.MustParseAddr("198.51.100.62")
	peer := netip.MustParseAddr("198.51.100.63")
	for _, tc := range []struct {
		name  string
		flush func(netip.Addr) error
	}{
		{"kernel filter", kernelFlushConntrack},
		{"table scan", scanFlushConntrack},
	} {
		t.Run(tc.name, func(t *testing.T) {
			flows := []struct {
				src, dst netip.Addr
				port     uint16
				keep     bool
			}{
				{sandbox, peer, 40001, false}, // the sandbox's outbound
				{peer, sandbox, 40002, false}, // into the sandbox
				{other, peer, 40003, true},
				{peer, other, 40004, true},
			}
			for _, f := range flows {
				putFlow(t, f.src, f.dst, f.port)
			}
			t.Cleanup(func() { _ = scanFlushConntrack(other) })
			if err := tc.flush(sandbox); err != nil {
				if tc.name == "kernel filter" && errors.Is(err, unix.EINVAL) {
					t.Skipf("this kernel has no filtered flush (Linux 6.12 on): %v", err)
				}
				t.Fatal(err)
			}
			for _, f := range flows {
				if got := hasFlow(t, f.src, f.dst, f.port); got != f.keep {
					t.Errorf("flow %s -> %s:%d present = %v after flushing %s, want %v", f.src, f.dst, f.port, got, sandbox, f.keep)
				}
			}
		})
	}
}

// putFlow adds a UDP flow src:port -> dst:53 to the host's table.
func putFlow(t *testing.T, src, dst netip.Addr, port uint16) {
	t.Helper()
	flow := &netlink.ConntrackFlow{
		FamilyType: unix.AF_INET,
		Forward:    netlink.IPTuple{SrcIP: net.IP(src.AsSlice()), DstIP: net.IP(dst.AsSlice()), Protocol: unix.IPPROTO_UDP, SrcPort: port, DstPort: 53},
		Reverse:    netlink.IPTuple{SrcIP: net.IP(dst.AsSlice()), DstIP: net.IP(src.AsSlice()), Protocol: unix.IPPROTO_UDP, SrcPort: 53, DstPort: port},
		TimeOut:    120,
	}
	if err := netlink.ConntrackCreate(netlink.ConntrackTable, unix.AF_INET, flow); err != nil {
		t.Fatalf("create flow %s -> %s:%d: %v", src, dst, port, err)
	}
}

// hasFlow reports whether the host's table holds the flow putFlow made.
func hasFlow(t *testing.T, src, dst netip.Addr, port uint16) bool {
	t.Helper()
	flows, err := netlink.ConntrackTableList(netlink.ConntrackTable, unix.AF_INET)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range flows {
		if f.Forward.SrcIP.Equal(net.IP(src.AsSlice())) && f.Forward.DstIP.Equal(net.IP(dst.AsSlice())) && f.Forward.SrcPort == port {
			return true
		}
	}
	return false
}
