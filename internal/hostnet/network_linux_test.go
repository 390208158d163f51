package hostnet

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/berth-sandbox/berth/errdefs"
)

func TestAttachCreatesEverything(t *testing.T) {
	n := newTestNetwork(t, Config{})
	forwarding := readForwarding(t)
	att := mustAttach(t, n, "sbcreate")
	if got := readForwarding(t); got != forwarding {
		t.Errorf("host forwarding sysctls changed from %q to %q", forwarding, got)
	}

	if !n.cfg.Pool.Contains(att.HostIP) || att.SandboxIP != att.HostIP.Next() {
		t.Errorf("addresses host=%s sandbox=%s, want a .1/.2 pair in %s", att.HostIP, att.SandboxIP, n.cfg.Pool)
	}
	if len(att.HostIface) > 15 || !strings.HasPrefix(att.HostIface, n.names.linkPrefix) {
		t.Errorf("HostIface = %q, want <=15 chars with prefix %q", att.HostIface, n.names.linkPrefix)
	}

	// The netns file is where `ip netns` looks, and is a live netns.
	entries, err := os.ReadDir(DefaultNetnsDir)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(entries, func(e os.DirEntry) bool { return filepath.Join(DefaultNetnsDir, e.Name()) == att.NetNSPath }) {
		t.Errorf("%s not listed in %s", att.NetNSPath, DefaultNetnsDir)
	}
	if !isNetnsMount(att.NetNSPath) {
		t.Errorf("%s is not an nsfs mount", att.NetNSPath)
	}
	if ip, err := exec.LookPath("ip"); err == nil {
		out, err := exec.Command(ip, "netns", "list").CombinedOutput()
		if err != nil || !strings.Contains(string(out), filepath.Base(att.NetNSPath)) {
			t.Errorf("ip netns list = %q (%v), want %s in it", out, err, filepath.Base(att.NetNSPath))
		}
	}

	// Host side: alias, address, up.
	host, err := netlink.LinkByName(att.HostIface)
	if err != nil {
		t.Fatalf("host link: %v", err)
	}
	if got, want := host.Attrs().Alias, "berth/"+n.cfg.Instance+"/sbcreate"; got != want {
		t.Errorf("host link alias = %q, want %q", got, want)
	}
	if host.Attrs().Flags&net.FlagUp == 0 {
		t.Errorf("host link %s is down", att.HostIface)
	}
	if got, ok, err := hostAddr(host, n.cfg.Pool); err != nil || !ok || got != att.HostIP {
		t.Errorf("host link address = %s, want %s", got, att.HostIP)
	}

	// Sandbox side: eth0 with .2/30, lo up, default route via .1, sysctls.
	h, err := handleAt(att.NetNSPath)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	eth, err := h.LinkByName("eth0")
	if err != nil {
		t.Fatalf("eth0 in netns: %v", err)
	}
	if eth.Attrs().Flags&net.FlagUp == 0 {
		t.Error("eth0 is down")
	}
	addrs, err := h.AddrList(eth, netlink.FAMILY_ALL)
	if err != nil {
		t.Fatal(err)
	}
	if len(addrs) != 1 || addrs[0].IPNet.String() != netip.PrefixFrom(att.SandboxIP, 30).String() {
		t.Errorf("eth0 addresses = %v, want only %s/30 (no IPv6)", addrs, att.SandboxIP)
	}
	lo, err := h.LinkByName("lo")
	if err != nil || lo.Attrs().Flags&net.FlagUp == 0 {
		t.Errorf("lo in netns not up (%v)", err)
	}
	routes, err := h.RouteList(nil, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(routes, func(r netlink.Route) bool {
		return (r.Dst == nil || r.Dst.String() == "0.0.0.0/0") && r.Gw.String() == att.HostIP.String()
	}) {
		t.Errorf("routes in netns = %v, want default via %s", routes, att.HostIP)
	}
	for path, want := range map[string]string{
		"net/ipv4/ip_unprivileged_port_start": "0",
		"net/ipv4/ping_group_range":           "0\t2147483647",
		"net/ipv6/conf/eth0/disable_ipv6":     "1",
	} {
		var got []byte
		err := inNetns(att.NetNSPath, func() error {
			var err error
			got, err = os.ReadFile(filepath.Join("/proc/sys", path))
			return err
		})
		if err != nil || strings.TrimSpace(string(got)) != want {
			t.Errorf("sysctl %s in netns = %q (%v), want %q", path, got, err, want)
		}
	}
}

// readForwarding reads the host's global forwarding switches, which
// hostnet must leave alone.
func readForwarding(t *testing.T) string {
	t.Helper()
	var out []string
	for _, p := range []string{"net/ipv4/ip_forward", "net/ipv4/conf/all/forwarding", "net/ipv6/conf/all/forwarding"} {
		b, err := os.ReadFile(filepath.Join("/proc/sys", p))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
		out = append(out, p+"="+strings.TrimSpace(string(b)))
	}
	return strings.Join(out, " ")
}

func TestAttachRejects(t *testing.T) {
	n := newTestNetwork(t, Config{})
	mustAttach(t, n, "sbdup")
	tests := []struct {
		id   string
		want error
	}{
		{"sbdup", errdefs.ErrAlreadyExists},
		{"", errdefs.ErrInvalidArgument},
		{"../etc", errdefs.ErrInvalidArgument},
		{"a/b", errdefs.ErrInvalidArgument},
		{strings.Repeat("x", 65), errdefs.ErrInvalidArgument},
	}
	for _, tt := range tests {
		if _, err := n.Attach(t.Context(), tt.id); !errors.Is(err, tt.want) {
			t.Errorf("Attach(%q) = %v, want %v", tt.id, err, tt.want)
		}
	}
}

// TestReachability checks the one allowed direction (host to sandbox) and
// that nothing the sandbox starts gets anywhere.
func TestReachability(t *testing.T) {
	n := newTestNetwork(t, Config{})
	a := mustAttach(t, n, "sba")
	b := mustAttach(t, n, "sbb")
	listenIn(t, a.NetNSPath, net.JoinHostPort(a.SandboxIP.String(), "49983"))
	listenIn(t, b.NetNSPath, net.JoinHostPort(b.SandboxIP.String(), "49983"))

	// A host service on every address of the host.
	hostLn, err := net.Listen("tcp4", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hostLn.Close() })
	go serveEcho(hostLn)
	hostPort := fmt.Sprint(hostLn.Addr().(*net.TCPAddr).Port)

	// The host reaches both agents.
	for _, att := range []Attachment{a, b} {
		if err := dialRead(net.JoinHostPort(att.SandboxIP.String(), "49983"), 2*time.Second); err != nil {
			t.Errorf("host -> %s agent: %v", att.ID, err)
		}
	}

	const short = 5 * time.Second // a refusal is immediate; only a drop would wait it out
	tests := []struct {
		name string
		addr string
	}{
		{"host side of own veth", net.JoinHostPort(a.HostIP.String(), hostPort)},
		{"host side of other veth", net.JoinHostPort(b.HostIP.String(), hostPort)},
		{"loopback", net.JoinHostPort("127.0.0.1", hostPort)},
		{"other sandbox", net.JoinHostPort(b.SandboxIP.String(), "49983")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// The dial's own timeout bounds it; how fast it fails under
			// load is no part of the property.
			err := dialFrom(a.NetNSPath, tt.addr, short)
			if err == nil {
				t.Fatalf("sandbox a -> %s (%s) connected, want failure", tt.addr, tt.name)
			}
			// Refused at once with a reset, not left to time out.
			if !errors.Is(err, syscall.ECONNREFUSED) {
				t.Errorf("sandbox a -> %s: %v, want connection refused", tt.addr, err)
			}
		})
	}
	// The same dial from the host side works, and the sandbox chain's
	// refusal counted the sandbox's packets: the failures above are the
	// firewall's doing, not a routing accident.
	if err := dialRead(net.JoinHostPort(a.HostIP.String(), hostPort), 2*time.Second); err != nil {
		t.Errorf("host -> %s:%s: %v", a.HostIP, hostPort, err)
	}
	if got := dropCount(t, n, n.SandboxChain(a.ID)); got == 0 {
		t.Errorf("sandbox chain refusal counted %d packets, want > 0", got)
	}
}

func TestTwoInstancesSharePool(t *testing.T) {
	n1 := newTestNetwork(t, Config{Instance: testInstance(t, 'p')})
	n2 := newTestNetwork(t, Config{Instance: testInstance(t, 'q')})
	// The same ids in both, attached concurrently: names, netns files and
	// chains are per instance, the allocator starts both at the same slot,
	// and only the host-wide lock keeps them from taking the same /30.
	var (
		mu   sync.Mutex
		atts []Attachment
		wg   sync.WaitGroup
	)
	for _, n := range []*Network{n1, n2} {
		for _, id := range []string{"sb1", "sb2", "sb3"} {
			wg.Go(func() {
				att, err := n.Attach(t.Context(), id)
				if err != nil {
					t.Errorf("instance %s Attach(%q): %v", n.cfg.Instance, id, err)
					return
				}
				mu.Lock()
				atts = append(atts, att)
				mu.Unlock()
			})
		}
	}
	wg.Wait()
	for i, x := range atts {
		for _, y := range atts[i+1:] {
			if netip.PrefixFrom(x.HostIP, 30).Masked().Overlaps(netip.PrefixFrom(y.HostIP, 30).Masked()) {
				t.Errorf("%s (%s) and %s (%s) overlap", x.HostIface, x.HostIP, y.HostIface, y.HostIP)
			}
		}
	}
	for _, n := range []*Network{n1, n2} {
		ids, err := n.List(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if want := []string{"sb1", "sb2", "sb3"}; !slices.Equal(ids, want) {
			t.Errorf("instance %s List = %v, want %v", n.cfg.Instance, ids, want)
		}
	}
	// Detaching in one instance leaves the other's sandbox alone.
	if err := n1.Detach(t.Context(), "sb1"); err != nil {
		t.Fatal(err)
	}
	if _, err := n2.Lookup(t.Context(), "sb1"); err != nil {
		t.Errorf("n2.Lookup(sb1) after n1.Detach(sb1): %v", err)
	}
}

func TestDetachRemovesEverything(t *testing.T) {
	n := newTestNetwork(t, Config{})
	att := mustAttach(t, n, "sbgone")
	for i := range 2 { // idempotent
		if err := n.Detach(t.Context(), "sbgone"); err != nil {
			t.Fatalf("Detach #%d: %v", i+1, err)
		}
	}
	assertGone(t, n, att)
	if _, err := n.Lookup(t.Context(), "sbgone"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Lookup after Detach = %v, want ErrNotFound", err)
	}
}

func assertGone(t *testing.T, n *Network, att Attachment) {
	t.Helper()
	if _, err := os.Lstat(n.NetnsPath(att.ID)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("netns file %s still there (%v)", n.NetnsPath(att.ID), err)
	}
	if att.HostIface != "" && linkExists(att.HostIface) {
		t.Errorf("link %s still there", att.HostIface)
	}
	if link, err := n.findLink(att.ID); err != nil || link != nil {
		t.Errorf("findLink(%q) = %v, %v; want none", att.ID, link, err)
	}
	d := dumpFirewall(t, n)
	if strings.Contains(d, n.SandboxChain(att.ID)) || (att.HostIface != "" && strings.Contains(d, att.HostIface)) {
		t.Errorf("firewall still mentions %s:\n%s", att.ID, d)
	}
	ids, err := n.List(t.Context())
	if err != nil || slices.Contains(ids, att.ID) {
		t.Errorf("List = %v, %v; want no %s", ids, err, att.ID)
	}
	if names, err := n.ownReservations(att.ID); err != nil || len(names) > 0 {
		t.Errorf("reservations of %s = %v, %v; want none", att.ID, names, err)
	}
}

// TestReservationSurvivesCrash: a daemon killed after reserving an address
// and before configuring it leaves only the reservation. The restarted
// daemon lists the id (so reconcile detaches it), never hands the /30 to
// another sandbox meanwhile, and frees it on Detach.
func TestReservationSurvivesCrash(t *testing.T) {
	n := newTestNetwork(t, Config{})
	p, err := n.reserve(t.Context(), "sbcrash", netip.Addr{})
	if err != nil {
		t.Fatal(err)
	}
	// The restart: a fresh Network of the same instance.
	n2, err := New(t.Context(), n.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if ids, err := n2.List(t.Context()); err != nil || !slices.Contains(ids, "sbcrash") {
		t.Errorf("List after restart = %v, %v; want sbcrash (its reservation)", ids, err)
	}
	if _, err := n2.Attach(t.Context(), "sbcrash"); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("Attach over a leftover reservation = %v, want ErrAlreadyExists", err)
	}
	// Asking for the reserved /30 gets another one.
	want := p.Addr().Next().Next()
	att, err := n2.AttachToAt(t.Context(), "sbother", "", want)
	if err != nil {
		t.Fatal(err)
	}
	if p.Contains(att.SandboxIP) {
		t.Errorf("sbother got %s inside sbcrash's reserved %s", att.SandboxIP, p)
	}
	if err := n2.Detach(t.Context(), "sbcrash"); err != nil {
		t.Fatal(err)
	}
	assertGone(t, n2, Attachment{ID: "sbcrash"})
	// Freed: now the /30 can be had.
	att, err = n2.AttachToAt(t.Context(), "sbthird", "", want)
	if err != nil {
		t.Fatal(err)
	}
	if att.SandboxIP != want {
		t.Errorf("sbthird got %s, want the freed %s", att.SandboxIP, want)
	}
}

func TestLookupAfterRestart(t *testing.T) {
	n := newTestNetwork(t, Config{})
	att := mustAttach(t, n, "sbkeep")
	if err := n.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	// A restarted daemon: same config, fresh Network, table set up again.
	n2, err := New(t.Context(), n.cfg)
	if err != nil {
		t.Fatal(err)
	}
	got, err := n2.Lookup(t.Context(), "sbkeep")
	if err != nil {
		t.Fatalf("Lookup after restart: %v", err)
	}
	if got != att {
		t.Errorf("Lookup = %+v, want %+v", got, att)
	}
	// The re-run setup kept the sandbox reachable.
	listenIn(t, att.NetNSPath, net.JoinHostPort(att.SandboxIP.String(), "49983"))
	if err := dialRead(net.JoinHostPort(att.SandboxIP.String(), "49983"), 2*time.Second); err != nil {
		t.Errorf("host -> agent after restart: %v", err)
	}
	if _, err := n2.Lookup(t.Context(), "sbnever"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Lookup(unknown) = %v, want ErrNotFound", err)
	}
}

func TestLookupRepairsFirewall(t *testing.T) {
	n := newTestNetwork(t, Config{})
	att := mustAttach(t, n, "sbrepair")
	if err := n.fw.removeSandbox(n.SandboxChain(att.ID)); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Lookup(t.Context(), att.ID); err != nil {
		t.Fatalf("Lookup: %v", err)
	}
	listenIn(t, att.NetNSPath, net.JoinHostPort(att.SandboxIP.String(), "49983"))
	if err := dialRead(net.JoinHostPort(att.SandboxIP.String(), "49983"), 2*time.Second); err != nil {
		t.Errorf("host -> agent after repair: %v", err)
	}
}

func TestAttachFailureLeavesNothing(t *testing.T) {
	for _, step := range []string{"netns", "sysctl", "reserve", "link", "sandbox_side", "firewall"} {
		t.Run(step, func(t *testing.T) {
			n := newTestNetwork(t, Config{})
			injected := errors.New("injected")
			var sawIface string
			n.failpoint = func(s string) error {
				if s == "link" {
					// Remember the link so we can check it is gone.
					if l, err := n.findLink("sbfail"); err == nil && l != nil {
						sawIface = l.Attrs().Name
					}
				}
				if s == step {
					return injected
				}
				return nil
			}
			if _, err := n.Attach(t.Context(), "sbfail"); !errors.Is(err, injected) {
				t.Fatalf("Attach with failure after %s = %v, want the injected error", step, err)
			}
			assertGone(t, n, Attachment{ID: "sbfail", HostIface: sawIface})
			n.failpoint = nil
			mustAttach(t, n, "sbfail") // the id is usable again
		})
	}
}

func TestTeardown(t *testing.T) {
	n := newTestNetwork(t, Config{})
	mustAttach(t, n, "sbtd")
	if err := n.Teardown(t.Context()); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("Teardown with a sandbox attached = %v, want ErrFailedPrecondition", err)
	}
	if err := n.Detach(t.Context(), "sbtd"); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if err := n.Teardown(t.Context()); err != nil {
			t.Fatalf("Teardown #%d: %v", i+1, err)
		}
	}
	if tableExists(t, n.TableName()) {
		t.Errorf("table %s still exists after Teardown", n.TableName())
	}
}

// TestIPv6Dropped turns IPv6 back on for one sandbox (both veth ends, with
// test-only ULA addresses) and checks the firewall still drops what the
// sandbox sends over it.
func TestIPv6Dropped(t *testing.T) {
	if _, err := os.Stat("/proc/sys/net/ipv6"); err != nil {
		t.Skip("kernel without IPv6")
	}
	n := newTestNetwork(t, Config{})
	att := mustAttach(t, n, "sbv6")
	hostV6 := netip.MustParsePrefix("fdb3:7a1e:9c00::1/126")
	sbV6 := netip.MustParsePrefix("fdb3:7a1e:9c00::2/126")

	if err := writeSysctl("net/ipv6/conf/"+att.HostIface+"/disable_ipv6", "0"); err != nil {
		t.Fatal(err)
	}
	host, err := netlink.LinkByName(att.HostIface)
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.AddrAdd(host, &netlink.Addr{IPNet: ipNet(hostV6), Flags: unix.IFA_F_NODAD}); err != nil {
		t.Fatal(err)
	}
	err = inNetns(att.NetNSPath, func() error {
		if err := writeSysctl("net/ipv6/conf/eth0/disable_ipv6", "0"); err != nil {
			return err
		}
		eth, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		return netlink.AddrAdd(eth, &netlink.Addr{IPNet: ipNet(sbV6), Flags: unix.IFA_F_NODAD})
	})
	if err != nil {
		t.Fatal(err)
	}

	hostLn, err := net.Listen("tcp6", net.JoinHostPort(hostV6.Addr().String(), "0"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hostLn.Close() })
	go serveEcho(hostLn)

	chain := n.SandboxChain(att.ID)
	before := dropCount(t, n, chain)
	err = inNetns(att.NetNSPath, func() error {
		c, err := net.DialTimeout("tcp6", hostLn.Addr().String(), 300*time.Millisecond)
		if err == nil {
			c.Close()
		}
		return err
	})
	if err == nil {
		t.Fatalf("sandbox -> %s over IPv6 connected, want it dropped", hostLn.Addr())
	}
	// The sandbox's IPv6 (neighbour solicitations, then the SYN) reached the
	// host and was counted by the sandbox chain's IPv6 drop.
	if after := dropCount(t, n, chain); after <= before {
		t.Errorf("%s drop counters %d -> %d, want the IPv6 packets counted", chain, before, after)
	}
}

// TestConcurrentAttachDetach runs many sandboxes of one instance through
// Attach and Detach at once.
func TestConcurrentAttachDetach(t *testing.T) {
	n := newTestNetwork(t, Config{})
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			id := fmt.Sprintf("sbpar%d", i)
			att, err := n.Attach(t.Context(), id)
			if err != nil {
				t.Errorf("Attach(%q): %v", id, err)
				return
			}
			if got, err := n.Lookup(t.Context(), id); err != nil || got != att {
				t.Errorf("Lookup(%q) = %+v, %v; want %+v", id, got, err, att)
			}
			if err := n.Detach(t.Context(), id); err != nil {
				t.Errorf("Detach(%q): %v", id, err)
			}
		})
	}
	wg.Wait()
	if ids, err := n.List(t.Context()); err != nil || len(ids) != 0 {
		t.Errorf("List after all detached = %v, %v; want none", ids, err)
	}
}

// A sandbox whose first derived link name was taken gets the next one;
// findLink (and so Lookup and Detach) still finds it after the first name
// is freed again.
func TestLinkNameTaken(t *testing.T) {
	n := newTestNetwork(t, Config{})
	first := n.names.link("sbtaken", 0)
	// A veth pair: the host may have no dummy driver.
	dummy := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: first}, PeerName: testInstance(t, 'x')}
	if err := netlink.LinkAdd(dummy); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = netlink.LinkDel(dummy) })
	att := mustAttach(t, n, "sbtaken")
	if att.HostIface == first {
		t.Fatalf("attached on %s, which a dummy link holds", first)
	}
	if err := netlink.LinkDel(dummy); err != nil {
		t.Fatal(err)
	}
	if got, err := n.Lookup(t.Context(), "sbtaken"); err != nil || got != att {
		t.Errorf("Lookup = %+v, %v; want %+v", got, err, att)
	}
	if err := n.Detach(t.Context(), "sbtaken"); err != nil {
		t.Fatal(err)
	}
	assertGone(t, n, att)
}

// A firewall chain left alone (link, netns and reservation gone) still
// counts as a leftover: Attach refuses the id until Detach.
func TestLeftoverChainOnly(t *testing.T) {
	n := newTestNetwork(t, Config{})
	if has, err := n.fw.hasChain(n.SandboxChain("sbchain")); err != nil || has {
		t.Fatalf("hasChain before any attach = %v, %v", has, err)
	}
	att := mustAttach(t, n, "sbchain")
	link, err := n.findLink("sbchain")
	if err != nil || link == nil {
		t.Fatalf("findLink = %v, %v", link, err)
	}
	if err := deleteLink(link); err != nil {
		t.Fatal(err)
	}
	if err := removeNetns(att.NetNSPath); err != nil {
		t.Fatal(err)
	}
	if err := n.release("sbchain"); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Attach(t.Context(), "sbchain"); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("Attach over a leftover chain = %v, want ErrAlreadyExists", err)
	}
	if err := n.Detach(t.Context(), "sbchain"); err != nil {
		t.Fatal(err)
	}
	if has, err := n.fw.hasChain(n.SandboxChain("sbchain")); err != nil || has {
		t.Errorf("hasChain after Detach = %v, %v", has, err)
	}
	mustAttach(t, n, "sbchain")
}
