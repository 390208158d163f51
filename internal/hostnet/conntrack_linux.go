package hostnet

import (
	"errors"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// ctnetlink's attributes and flags this file uses that the netlink
// package does not name (include/uapi/linux/netfilter/nfnetlink_conntrack.h
// and net/netfilter/nf_internals.h).
const (
	ctaFilter          = 25 // CTA_FILTER
	ctaFilterOrigFlags = 1  // CTA_FILTER_ORIG_FLAGS
	ctaFilterIPSrc     = 1 << 0
	ctaFilterIPDst     = 1 << 1
)

// flushConntrack forgets tracked flows of a sandbox address (as the
// original source or destination), best effort: without conntrack loaded
// there is nothing to forget.
//
// The kernel deletes them itself where it can (a flush with CTA_FILTER,
// Linux 6.12 on): two requests, and no flow crosses into user space.
// Older kernels read the request as the delete of one flow by its tuple,
// which names no protocol, and fail it (EINVAL), never deleting more than
// asked; then the host's whole table is read here and the matches
// deleted one by one, which costs every pause and destroy tens of
// milliseconds per ten thousand flows the host tracks.
func (n *Network) flushConntrack(ip netip.Addr) {
	if !ip.Is4() {
		return
	}
	if kernelFlushConntrack(ip) == nil {
		return
	}
	if err := scanFlushConntrack(ip); err != nil {
		n.log.Debug("conntrack_flush_failed", "sandbox_ip", ip, "err", err)
	}
}

// kernelFlushConntrack asks the kernel to delete the IPv4 flows whose
// original direction has ip as the source or the destination: one
// filtered flush each.
func kernelFlushConntrack(ip netip.Addr) error {
	return errors.Join(kernelFlushConntrackBy(ip, ctaFilterIPSrc), kernelFlushConntrackBy(ip, ctaFilterIPDst))
}

// kernelFlushConntrackBy is one of kernelFlushConntrack's flushes: the
// flows with ip as their original source (ctaFilterIPSrc) or destination
// (ctaFilterIPDst).
func kernelFlushConntrackBy(ip netip.Addr, which uint32) error {
	req := nl.NewNetlinkRequest(int(netlink.ConntrackTable)<<8|nl.IPCTNL_MSG_CT_DELETE, unix.NLM_F_ACK)
	req.AddData(&nl.Nfgenmsg{NfgenFamily: unix.AF_INET, Version: nl.NFNETLINK_V0})
	addr := ip.As4()
	field := nl.CTA_IP_V4_SRC
	if which == ctaFilterIPDst {
		field = nl.CTA_IP_V4_DST
	}
	tuple := nl.NewRtAttr(unix.NLA_F_NESTED|nl.CTA_TUPLE_ORIG, nil)
	tupleIP := tuple.AddRtAttr(unix.NLA_F_NESTED|nl.CTA_TUPLE_IP, nil)
	tupleIP.AddRtAttr(field, addr[:])
	req.AddData(tuple)
	filter := nl.NewRtAttr(unix.NLA_F_NESTED|ctaFilter, nil)
	filter.AddRtAttr(ctaFilterOrigFlags, nl.Uint32Attr(which))
	req.AddData(filter)
	_, err := req.Execute(unix.NETLINK_NETFILTER, 0)
	return err
}

// scanFlushConntrack reads the host's whole conntrack table and deletes
// the IPv4 flows with ip as their original source or destination.
func scanFlushConntrack(ip netip.Addr) error {
	var src, dst netlink.ConntrackFilter
	if err := src.AddIP(netlink.ConntrackOrigSrcIP, net.IP(ip.AsSlice())); err != nil {
		return err
	}
	if err := dst.AddIP(netlink.ConntrackOrigDstIP, net.IP(ip.AsSlice())); err != nil {
		return err
	}
	_, err := netlink.ConntrackDeleteFilters(netlink.ConntrackTable, unix.AF_INET, &src, &dst)
	return err
}
