package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/client"
)

// Attacks a red team ran against the egress policy from inside sandboxes,
// each pinned here: path rules walked around with dot segments and
// encodings, HTTP rules bypassed through a shared address, deny rules
// bypassed with NAT64 and 6to4 forms, a policy change that did not reach
// open connections, and denials that were silent or slow.

// nat64 is the NAT64 (64:ff9b::/96) form of an IPv4 address.
func nat64(ip4 string) string {
	var a, b, c, d int
	fmt.Sscanf(ip4, "%d.%d.%d.%d", &a, &b, &c, &d)
	return fmt.Sprintf("64:ff9b::%02x%02x:%02x%02x", a, b, c, d)
}

// sixToFour is the 6to4 (2002::/16) form of an IPv4 address.
func sixToFour(ip4 string) string {
	var a, b, c, d int
	fmt.Sscanf(ip4, "%d.%d.%d.%d", &a, &b, &c, &d)
	return fmt.Sprintf("2002:%02x%02x:%02x%02x::1", a, b, c, d)
}

// waitRecord waits, at most a minute, for the daemon to report a record in
// the sandbox's audit log that matches.
func waitRecord(t *testing.T, d *Daemon, id string, what string, pred func(client.NetworkRecord) bool) client.NetworkRecord {
	t.Helper()
	var found client.NetworkRecord
	waitFor(t, time.Minute, "audit record "+what, func() bool {
		recs, err := d.Client.NetworkLog(context.Background(), id, false)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range recs {
			if pred(r) {
				found = r
				return true
			}
		}
		return false
	})
	return found
}

// waitOutput waits, at most a minute, for a file in the sandbox to contain
// want (what a background command in the sandbox reports).
func waitOutput(t *testing.T, sb *client.Sandbox, file, want string) string {
	t.Helper()
	var out string
	waitFor(t, time.Minute, file+" to contain "+want, func() bool {
		out, _, _ = Run(t, sb, "cat "+file+" 2>/dev/null")
		return strings.Contains(out, want)
	})
	return out
}

func TestEgressHostile(t *testing.T) {
	env := startEgress(t)
	ip1, ip2 := env.tn.IP.String(), env.tn.IP2.String()
	sb := env.sandbox(t, &client.NetworkPolicy{
		Mode:  client.NetAllow,
		Allow: []string{"allowed.test", "second.test", "rebind.test", ip1 + ":443"},
		HTTP:  []client.HTTPRule{{Host: "api.test", Methods: []string{"GET"}, Path: "/public/"}},
	})

	// One DNS lookup (A and AAAA, in parallel) is one record.
	expect(t, sb, "dns allowed.test", 0, ip1)
	recs, err := env.d.Client.NetworkLog(context.Background(), sb.ID, false)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, r := range recs {
		if r.Proto == "dns" && r.Name == "allowed.test" {
			n++
		}
	}
	if n != 1 {
		t.Errorf("one lookup of allowed.test left %d DNS records, want 1: %+v", n, recs)
	}
	// A name whose every address is forbidden is refused, and logged as a
	// denial.
	expect(t, sb, "dns rebind.test", 1, "")
	waitRecord(t, env.d, sb.ID, "denying rebind.test", func(r client.NetworkRecord) bool {
		return r.Proto == "dns" && r.Name == "rebind.test" && r.Decision == "deny" && strings.Contains(r.Reason, "127.0.0.1")
	})

	// 1. Path rules: decided on the normalized path, which is what the
	// server gets; ambiguous encodings are refused outright.
	expect(t, sb, "https api.test -path /public/a", 0, "path=/public/a tls=true")
	expect(t, sb, "https api.test -path /public/./b//c", 0, "path=/public/b/c tls=true")
	expect(t, sb, "https api.test -path /public/../secret/x", 2, "403")
	expect(t, sb, "https api.test -path /public/%2e%2e/secret/x", 2, "400")
	expect(t, sb, "https api.test -path /public/%2E%2E%2Fsecret/x", 2, "400")
	expect(t, sb, "https api.test -path '/public/..;/secret/x'", 2, "400")
	expect(t, sb, "https api.test -path /public/%00/x", 2, "400")
	expect(t, sb, "http api.test -connect "+ip1+":80 -path /public/../secret/x", 2, "403")
	expect(t, sb, "http api.test -connect "+ip1+":80 -path /public/%2e%2e/secret/x", 2, "400")
	expect(t, sb, "http api.test -connect "+ip1+":80 -path /public/x", 0, "path=/public/x tls=false")
	waitRecord(t, env.d, sb.ID, "denying the walked-around path", func(r client.NetworkRecord) bool {
		return r.Name == "api.test" && r.Path == "/secret/x" && r.Decision == "deny"
	})

	// 2. A shared address: allowed.test (no rules) is served where api.test
	// (rules) is. TLS under allowed.test carrying Host: api.test is
	// intercepted and refused; without a name it is refused.
	expect(t, sb, "https allowed.test -host api.test -path /secret/x"+testCA, 2, "421")
	expect(t, sb, "https allowed.test"+testCA, 0, "issuer=Berth egress CA")
	expect(t, sb, "https "+ip1+" -sni '' -host api.test -path /secret/x", 1, "access denied")
	// A name on an address no ruled name has still passes through.
	expect(t, sb, "https second.test -connect "+ip2+":443"+testCA, 0, "issuer=berth test-net CA")

	// 6. A denied TLS connection says so at once (an access_denied alert).
	expect(t, sb, "https other.test -connect "+ip1+":443"+testCA, 1, "access denied")

	// 3. NAT64 and 6to4 forms of a denied IPv4 address are denied.
	open := env.sandbox(t, &client.NetworkPolicy{Mode: client.NetOpen, Deny: []string{ip2}})
	expect(t, open, "http "+ip2+" -connect "+ip1+":80", 2, "403")
	expect(t, open, "http ["+nat64(ip2)+"] -connect "+ip1+":80", 2, "403")
	expect(t, open, "http ["+sixToFour(ip2)+"] -connect "+ip1+":80", 2, "403")
	expect(t, open, "http ["+nat64("127.0.0.1")+"] -connect "+ip1+":80", 2, "403")
	waitRecord(t, env.d, open.ID, "denying the NAT64 form by the IPv4 rule", func(r client.NetworkRecord) bool {
		return strings.Trim(r.Name, "[]") == nat64(ip2) && r.Decision == "deny" && r.Rule == "deny "+ip2
	})
	// … and so is a name whose only answer (AAAA) is one.
	expect(t, open, "http nat64.test -connect "+ip1+":80", 2, "403")
	waitRecord(t, env.d, open.ID, "denying a name that resolves to the NAT64 form", func(r client.NetworkRecord) bool {
		return r.Name == "nat64.test" && r.Decision == "deny" && strings.Contains(r.Reason, "deny "+ip2)
	})
}

// TestEgressKillSwitch: a policy change reaches open connections: every
// further request on a kept-alive connection is decided by the new policy,
// and connections it refuses are closed.
func TestEgressKillSwitch(t *testing.T) {
	env := startEgress(t)
	ip1 := env.tn.IP.String()
	ctx := context.Background()
	pol := client.NetworkPolicy{
		Mode:  client.NetAllow,
		Allow: []string{"allowed.test", ip1 + ":7"},
		HTTP:  []client.HTTPRule{{Host: "api.test", Methods: []string{"GET"}, Path: "/public/"}},
	}
	sb := env.sandbox(t, &pol)
	bg := func(name, args string) {
		t.Helper()
		if _, stderr, code := env.d.CLI(t, nil, "exec", sb.ID, "--background", "--", "sh", "-c", "/tmp/egressprobe "+args+" >/tmp/"+name+".out 2>&1"); code != 0 {
			t.Fatalf("exec --background: %d %s", code, stderr)
		}
	}
	bg("rules", "keepalive api.test -connect "+ip1+":80 -path /public/a -wait /tmp/go-rules")
	bg("plain", "keepalive allowed.test -connect "+ip1+":80 -path / -wait /tmp/go-plain")
	bg("stream", "tcpstream "+ip1+":7 -wait /tmp/go-stream")
	waitOutput(t, sb, "/tmp/rules.out", "first=200")
	waitOutput(t, sb, "/tmp/plain.out", "first=200")
	waitOutput(t, sb, "/tmp/stream.out", "first=ok")

	// Narrower: api.test's rule moves to /v2/, and port 7 is no longer
	// allowed. The kept-alive connection stays open (api.test is still
	// allowed), but its next request is decided by the new rule; the
	// stream is closed.
	pol.HTTP[0].Path = "/v2/"
	pol.Allow = []string{"allowed.test"}
	if _, err := env.d.Client.SetNetworkPolicy(ctx, sb.ID, pol); err != nil {
		t.Fatal(err)
	}
	MustRun(t, sb, "touch /tmp/go-rules /tmp/go-stream")
	if out := waitOutput(t, sb, "/tmp/rules.out", "second="); !strings.Contains(out, "second=403") {
		t.Errorf("second request on a kept-alive connection after the rule changed: %q, want 403", out)
	}
	if out := waitOutput(t, sb, "/tmp/stream.out", "second="); !strings.Contains(out, "second=error") {
		t.Errorf("TCP stream after its rule was removed: %q, want an error", out)
	}
	waitRecord(t, env.d, sb.ID, "for the closed stream", func(r client.NetworkRecord) bool {
		return r.Proto == "tcp" && r.Port == 7 && r.Decision == "deny" && strings.Contains(r.Reason, "policy changed")
	})

	// `net set --net none` is a kill switch.
	if _, stderr, code := env.d.CLI(t, nil, "net", "set", sb.ID, "--net", "none"); code != 0 {
		t.Fatalf("net set --net none: %d %s", code, stderr)
	}
	MustRun(t, sb, "touch /tmp/go-plain")
	if out := waitOutput(t, sb, "/tmp/plain.out", "second="); strings.Contains(out, "second=200") {
		t.Errorf("kept-alive connection after net set --net none: %q, want it closed or refused", out)
	}
	waitRecord(t, env.d, sb.ID, "for the closed HTTP connection", func(r client.NetworkRecord) bool {
		return r.Proto == "http" && r.Name == "allowed.test" && r.Decision == "deny" && strings.Contains(r.Reason, "policy changed")
	})
}

// TestEgressFirewallLog: what the firewall refuses before the proxy or
// resolver sees it (UDP, ICMP, everything in mode none, foreign DNS) is
// refused at once and reaches the audit log; inspect shows where the
// sandbox sits.
func TestEgressFirewallLog(t *testing.T) {
	env := startEgress(t)
	ip1, ip2 := env.tn.IP.String(), env.tn.IP2.String()
	ctx := context.Background()
	sb := env.sandbox(t, nil) // mode none
	gw := strings.TrimSpace(MustRun(t, sb, "ip route | awk '/default/ {print $3}'"))
	addr := strings.TrimSpace(MustRun(t, sb, "ip -4 -o addr show eth0 | awk '{print $4}' | cut -d/ -f1"))

	// Refused at once: the resolver's port is unreachable, TCP is reset.
	expect(t, sb, "dns allowed.test", 1, "connection refused")
	expect(t, sb, "tcp "+ip1+":7", 1, "connection refused")
	expect(t, sb, "udp "+ip1+":443", 1, "connection refused")
	for _, want := range []struct{ proto, ip string }{{"udp", gw}, {"tcp", ip1}, {"udp", ip1}} {
		r := waitRecord(t, env.d, sb.ID, want.proto+" to "+want.ip, func(r client.NetworkRecord) bool {
			return r.Rule == "firewall" && r.Proto == want.proto && r.IP == want.ip && r.Decision == "deny"
		})
		t.Logf("firewall record: %+v", r)
	}

	// Learn mode: UDP is refused and recorded too; mode allow: DNS to a
	// resolver other than the sandbox's own.
	if _, err := env.d.Client.SetNetworkPolicy(ctx, sb.ID, client.NetworkPolicy{Mode: client.NetLearn}); err != nil {
		t.Fatal(err)
	}
	expect(t, sb, "udp "+ip2+":443", 1, "")
	waitRecord(t, env.d, sb.ID, "for UDP in learn mode", func(r client.NetworkRecord) bool {
		return r.Rule == "firewall" && r.Proto == "udp" && r.IP == ip2 && r.Port == 443
	})
	if _, err := env.d.Client.SetNetworkPolicy(ctx, sb.ID, client.NetworkPolicy{Mode: client.NetAllow, Allow: []string{"allowed.test"}}); err != nil {
		t.Fatal(err)
	}
	expect(t, sb, "dns allowed.test -server "+ip2+":53", 1, "")
	waitRecord(t, env.d, sb.ID, "for DNS to a foreign resolver", func(r client.NetworkRecord) bool {
		return r.Rule == "firewall" && r.IP == ip2 && r.Port == 53 && strings.Contains(r.Reason, "resolver")
	})

	// --denied and --since.
	stdout, _, code := env.d.CLI(t, nil, "net", "log", sb.ID, "--denied", "--since", "1h")
	if code != 0 || !strings.Contains(stdout, "[firewall]") {
		t.Errorf("net log --denied --since 1h: exit %d\n%s", code, stdout)
	}
	future := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	if stdout, _, code := env.d.CLI(t, nil, "net", "log", sb.ID, "--since", future); code != 0 || stdout != "" {
		t.Errorf("net log --since %s: exit %d, %q; want nothing", future, code, stdout)
	}
	if _, stderr, code := env.d.CLI(t, nil, "net", "log", sb.ID, "--since", "yesterday"); code == 0 || !strings.Contains(stderr, "--since") {
		t.Errorf("net log --since yesterday: exit %d, %s; want an error naming --since", code, stderr)
	}
	if _, err := env.d.Client.NetworkLogFiltered(ctx, sb.ID, client.NetworkLogFilter{}); err != nil {
		t.Fatal(err)
	}

	// inspect: the sandbox's address, gateway and host link.
	stdout, stderr, code := env.d.CLI(t, nil, "inspect", sb.ID)
	if code != 0 {
		t.Fatalf("inspect: %d %s", code, stderr)
	}
	var got struct {
		Network *client.SandboxNetwork `json:"network"`
	}
	if err := json.Unmarshal([]byte(stdout), &got); err != nil {
		t.Fatalf("inspect output: %v\n%s", err, stdout)
	}
	if n := got.Network; n == nil || n.Address != addr || n.Gateway != gw || n.HostLink == "" {
		t.Errorf("inspect network = %+v, want address %s gateway %s and a host link", n, addr, gw)
	} else if _, err := net.InterfaceByName(n.HostLink); err != nil {
		t.Errorf("inspect host_link %q is not a host interface", n.HostLink)
	}
}
