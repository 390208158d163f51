package hostnet

import (
	"encoding/hex"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/berth-sandbox/berth/internal/policy"
)

var update = flag.Bool("update", false, "rewrite golden files")

func tableExists(t *testing.T, name string) bool {
	t.Helper()
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.ListTableOfFamily(name, nftables.TableFamilyINet)
	return err == nil
}

// dumpFirewall renders the instance's table as text, read back from the
// kernel through google/nftables.
func dumpFirewall(t *testing.T, n *Network) string {
	t.Helper()
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	table := n.fw.tbl()
	var b strings.Builder
	fmt.Fprintf(&b, "table inet %s\n", table.Name)

	sets, err := c.GetSets(table)
	if err != nil {
		t.Fatalf("GetSets: %v", err)
	}
	sort.Slice(sets, func(i, j int) bool { return sets[i].Name < sets[j].Name })
	for _, s := range sets {
		// Key and data types are not shown: google/nftables v0.3.0 decodes
		// a vmap's key type as "verdict".
		fmt.Fprintf(&b, "  set %s map=%v\n", s.Name, s.IsMap)
		elems, err := c.GetSetElements(s)
		if err != nil {
			t.Fatalf("GetSetElements(%s): %v", s.Name, err)
		}
		var lines []string
		for _, e := range elems {
			line := fmt.Sprintf("    elem %q", ifname(e.Key))
			if v, ok := elemVerdict(e); ok {
				line += " : " + renderVerdict(v)
			}
			lines = append(lines, line)
		}
		sort.Strings(lines)
		for _, l := range lines {
			b.WriteString(l + "\n")
		}
	}

	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		t.Fatalf("ListChains: %v", err)
	}
	var own []*nftables.Chain
	for _, ch := range chains {
		if ch.Table.Name == table.Name {
			own = append(own, ch)
		}
	}
	sort.Slice(own, func(i, j int) bool { return own[i].Name < own[j].Name })
	for _, ch := range own {
		fmt.Fprintf(&b, "  chain %s", ch.Name)
		if ch.Hooknum != nil {
			fmt.Fprintf(&b, " type=%s hook=%d priority=%d", ch.Type, *ch.Hooknum, *ch.Priority)
			if ch.Policy != nil {
				fmt.Fprintf(&b, " policy=%d", *ch.Policy)
			}
		}
		b.WriteString("\n")
		rules, err := c.GetRules(table, ch)
		if err != nil {
			t.Fatalf("GetRules(%s): %v", ch.Name, err)
		}
		for _, r := range rules {
			var parts []string
			for _, e := range r.Exprs {
				parts = append(parts, renderExpr(e))
			}
			fmt.Fprintf(&b, "    %s\n", strings.Join(parts, " "))
		}
	}
	return b.String()
}

func renderVerdict(v *expr.Verdict) string {
	names := map[expr.VerdictKind]string{
		expr.VerdictAccept: "accept", expr.VerdictDrop: "drop", expr.VerdictJump: "jump",
		expr.VerdictGoto: "goto", expr.VerdictReturn: "return", expr.VerdictContinue: "continue",
	}
	s, ok := names[v.Kind]
	if !ok {
		s = fmt.Sprintf("verdict(%d)", v.Kind)
	}
	if v.Chain != "" {
		s += " " + v.Chain
	}
	return s
}

func renderBytes(d []byte) string {
	for _, c := range d {
		if c < 0x20 || c > 0x7e {
			return "0x" + hex.EncodeToString(d)
		}
	}
	return fmt.Sprintf("%q", d)
}

func renderExpr(e expr.Any) string {
	switch e := e.(type) {
	case *expr.Meta:
		return fmt.Sprintf("[meta key=%d reg=%d]", e.Key, e.Register)
	case *expr.Cmp:
		return fmt.Sprintf("[cmp op=%d reg=%d %s]", e.Op, e.Register, renderBytes(e.Data))
	case *expr.Lookup:
		return fmt.Sprintf("[lookup @%s sreg=%d dreg=%d dregset=%v invert=%v]", e.SetName, e.SourceRegister, e.DestRegister, e.IsDestRegSet, e.Invert)
	case *expr.Counter:
		return "[counter]" // values vary
	case *expr.Verdict:
		return "[" + renderVerdict(e) + "]"
	case *expr.Payload:
		return fmt.Sprintf("[payload base=%d offset=%d len=%d reg=%d]", e.Base, e.Offset, e.Len, e.DestRegister)
	case *expr.Ct:
		return fmt.Sprintf("[ct key=%d reg=%d]", e.Key, e.Register)
	case *expr.Bitwise:
		return fmt.Sprintf("[bitwise sreg=%d dreg=%d len=%d mask=%s xor=%s]", e.SourceRegister, e.DestRegister, e.Len, renderBytes(e.Mask), renderBytes(e.Xor))
	default:
		return fmt.Sprintf("[%T %+v]", e, e)
	}
}

// TestFirewallGolden compares the rules of an instance with one sandbox
// with testdata/firewall.golden; run with -update after an intended change.
func TestFirewallGolden(t *testing.T) {
	n := newTestNetwork(t, Config{LogGroup: 4242})
	att := mustAttach(t, n, "sbgolden")
	// A second sandbox in mode allow shows the policy rules too.
	open := mustAttach(t, n, "sbgoldenallow")
	if err := n.SetMode(t.Context(), open.ID, policy.ModeAllow); err != nil {
		t.Fatal(err)
	}
	got := dumpFirewall(t, n)
	oip4, ohost4 := open.SandboxIP.As4(), open.HostIP.As4()
	ip4 := att.SandboxIP.As4()
	got = strings.NewReplacer(
		att.HostIface, "<host-iface>",
		n.names.linkPrefix, "<link-prefix>",
		n.names.table, "<table>",
		"0x"+hex.EncodeToString(ip4[:]), "<sandbox-ip>",
		open.HostIface, "<host-iface-2>",
		"0x"+hex.EncodeToString(oip4[:]), "<sandbox-ip-2>",
		"0x"+hex.EncodeToString(ohost4[:]), "<host-ip-2>",
	).Replace(got)

	path := filepath.Join("testdata", "firewall.golden")
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("firewall dump differs from %s (run with -update if intended)\ngot:\n%s\nwant:\n%s", path, got, want)
	}

	// Cross-check with the nft CLI that operators will read it correctly.
	if nft, err := exec.LookPath("nft"); err == nil {
		out, err := exec.Command(nft, "list", "table", "inet", n.TableName()).CombinedOutput()
		if err != nil {
			t.Fatalf("nft list table: %v: %s", err, out)
		}
		t.Logf("nft list table inet %s:\n%s", n.TableName(), out)
		for _, want := range []string{
			fmt.Sprintf("%q : jump %s", att.HostIface, n.SandboxChain(att.ID)),
			"ip saddr != " + att.SandboxIP.String() + " counter",
			"ct state established,related accept",
			"type filter hook prerouting priority",
			`log prefix "sbx-sbgolden policy" group 4242`,
			"meta l4proto tcp reject with tcp reset",
			"udp dport 53 counter",
		} {
			if !strings.Contains(string(out), want) {
				t.Errorf("nft list table lacks %q", want)
			}
		}
	}

	// Detach leaves the base table exactly as New made it.
	for _, id := range []string{att.ID, open.ID} {
		if err := n.Detach(t.Context(), id); err != nil {
			t.Fatal(err)
		}
	}
	after := dumpFirewall(t, n)
	if strings.Contains(after, "elem") || strings.Contains(after, chainPrefix) {
		t.Errorf("after Detach the table still has sandbox entries:\n%s", after)
	}
}

// dropCount sums the packet counters of the base chain's drop rules.
func dropCount(t *testing.T, n *Network, chain string) uint64 {
	t.Helper()
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	rules, err := c.GetRules(n.fw.tbl(), &nftables.Chain{Name: chain, Table: n.fw.tbl()})
	if err != nil {
		t.Fatalf("GetRules(%s): %v", chain, err)
	}
	var sum uint64
	for _, r := range rules {
		for _, e := range r.Exprs {
			if c, ok := e.(*expr.Counter); ok {
				sum += c.Packets
			}
		}
	}
	return sum
}

// TestFirewallCeiling checks that the operator's ceiling denials are
// refused (and logged as "ceiling") in a sandbox chain that lets anything
// out, ahead of the accept that sends TCP to the proxy, and are absent in
// mode none, which refuses everything anyway.
func TestFirewallCeiling(t *testing.T) {
	nft, err := exec.LookPath("nft")
	if err != nil {
		t.Skip("nft CLI not installed")
	}
	n := newTestNetwork(t, Config{LogGroup: 4243, CeilingDeny: []policy.PortPrefix{
		{Prefix: netip.MustParsePrefix("10.0.0.0/8")},
		{Prefix: netip.MustParsePrefix("203.0.113.7/32"), Port: 443},
		{Prefix: netip.MustParsePrefix("fc00::/7")},
	}})
	closed := mustAttach(t, n, "sbceilnone")
	open := mustAttach(t, n, "sbceilopen")
	if err := n.SetMode(t.Context(), open.ID, policy.ModeOpen); err != nil {
		t.Fatal(err)
	}
	chain := func(id string) string {
		out, err := exec.Command(nft, "list", "chain", "inet", n.TableName(), n.SandboxChain(id)).CombinedOutput()
		if err != nil {
			t.Fatalf("nft list chain: %v: %s", err, out)
		}
		return string(out)
	}
	got := chain(open.ID)
	first := strings.Index(got, "ip daddr 10.0.0.0/8")
	syn := strings.Index(got, "tcp flags")
	if first < 0 || syn < 0 || first > syn {
		t.Errorf("open chain lacks the ceiling's 10.0.0.0/8 refusal ahead of the proxy accept:\n%s", got)
	}
	for _, want := range []string{
		"ip daddr 203.0.113.7 tcp dport 443 counter",
		"ip daddr 203.0.113.7 tcp dport 443 reject with tcp reset",
		`log prefix "sbx-sbceilopen ceiling" group 4243`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("open chain lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "fc00") {
		t.Errorf("open chain matches IPv6 ceiling entries, which sandboxes cannot reach:\n%s", got)
	}
	if c := chain(closed.ID); strings.Contains(c, "10.0.0.0/8") {
		t.Errorf("mode none chain carries ceiling rules:\n%s", c)
	}
}

// TestFirewallConcurrentRemoves: sandboxes' firewall entries added and
// removed from many goroutines at once (a burst of creates and destroys)
// all go, with no error. Each change reads the map's elements and then
// writes, and a dump of a map another goroutine is changing came back
// without some elements, so a remove missed its own jump and the kernel
// refused to delete the chain still jumped to (EBUSY; seen as a leaked
// chain after 50 parallel destroys in TestConcurrentCreates).
func TestFirewallConcurrentRemoves(t *testing.T) {
	n := newTestNetwork(t, Config{})
	const count = 64
	chain := func(i int) string { return n.names.chain(fmt.Sprintf("sbconc%02d", i)) }
	iface := func(i int) string { return fmt.Sprintf("%sc%02d", n.names.linkPrefix, i) }
	ip := func(i int) netip.Addr { return netip.AddrFrom4([4]byte{100, 64, byte(i), 2}) }
	run := func(what string, fn func(i int) error) {
		errs := make(chan error, count)
		var wg sync.WaitGroup
		for i := range count {
			wg.Go(func() {
				if err := fn(i); err != nil {
					errs <- fmt.Errorf("%s %d: %w", what, i, err)
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	}
	run("add", func(i int) error { return n.fw.addSandbox(chain(i), iface(i), ip(i)) })
	run("remove", func(i int) error { return n.fw.removeSandbox(chain(i)) })
	left, err := n.fw.sandboxChains()
	if err != nil {
		t.Fatal(err)
	}
	c, err := conn()
	if err != nil {
		t.Fatal(err)
	}
	elems, err := c.GetSetElements(n.fw.vmap())
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 0 || len(elems) != 0 {
		t.Errorf("after the removes: chains %v and %d map elements left", left, len(elems))
	}
}
