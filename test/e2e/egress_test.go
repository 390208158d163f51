package e2e

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/test/harness"
)

// egressEnv is one daemon wired to a stand-in internet, and the probe
// binary the sandboxes run.
type egressEnv struct {
	d     *Daemon
	tn    *harness.TestNet
	probe string
}

func startEgress(t testing.TB) *egressEnv {
	t.Helper()
	harness.RequireHost(t)
	tn := harness.StartTestNet(t)
	probe := buildProbe(t)
	d := harness.StartDaemon(t, bin, tn.ConfigFile(t)...)
	return &egressEnv{d: d, tn: tn, probe: probe}
}

// buildProbe builds the probe binary the sandboxes run.
func buildProbe(t testing.TB) string {
	t.Helper()
	probe := filepath.Join(t.TempDir(), "egressprobe")
	cmd := exec.Command("go", "build", "-o", probe, "./test/harness/egressprobe")
	cmd.Dir = repoRoot(t)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build egressprobe: %v\n%s", err, out)
	}
	return probe
}

func repoRoot(t testing.TB) string {
	wd, _ := os.Getwd()
	for d := wd; d != "/"; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d
		}
	}
	t.Fatal("no go.mod above the working dir")
	return ""
}

// sandbox creates a sandbox with policy p and installs the probe and
// the test net's CA in it.
func (env *egressEnv) sandbox(t *testing.T, p *client.NetworkPolicy) *client.Sandbox {
	t.Helper()
	sb := env.d.Create(t, client.CreateRequest{Network: p})
	env.install(t, sb)
	return sb
}

func (env *egressEnv) install(t testing.TB, sb *client.Sandbox) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	bin, err := os.ReadFile(env.probe)
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.WriteFile(ctx, "/tmp/egressprobe", bytes.NewReader(bin)); err != nil {
		t.Fatal(err)
	}
	if err := sb.WriteFile(ctx, "/tmp/testca.pem", bytes.NewReader(env.tn.CAPEM)); err != nil {
		t.Fatal(err)
	}
	MustRun(t, sb, "chmod 755 /tmp/egressprobe")
}

// probe runs the probe in sb and returns its output and exit code.
func probe(t *testing.T, sb *client.Sandbox, args string) (string, int) {
	t.Helper()
	out, _, code := Run(t, sb, "/tmp/egressprobe "+args)
	return out, code
}

func expect(t *testing.T, sb *client.Sandbox, args string, wantCode int, wantOut string) {
	t.Helper()
	start := time.Now()
	out, code := probe(t, sb, args)
	t.Logf("%s probe %s: %d %q (%s)", start.Format("15:04:05.000"), args, code, out, time.Since(start))
	if code != wantCode || !strings.Contains(out, wantOut) {
		t.Errorf("egressprobe %s: exit %d, output %q; want exit %d containing %q", args, code, out, wantCode, wantOut)
	}
}

const testCA = " -ca /tmp/testca.pem"

func TestEgressDefaultNone(t *testing.T) {
	env := startEgress(t)
	ip1, ip2, hostIP := env.tn.IP.String(), env.tn.IP2.String(), env.tn.HostIP.String()
	_, _, _ = ip1, ip2, hostIP
	sb := env.sandbox(t, nil)
	p, err := env.d.Client.NetworkPolicy(context.Background(), sb.ID)
	if err != nil || p.Mode != client.NetNone {
		t.Fatalf("default policy = %+v, %v; want mode none", p, err)
	}
	expect(t, sb, "dns allowed.test", 1, "")
	expect(t, sb, "dns allowed.test -server "+ip1+":53", 1, "")
	expect(t, sb, "https allowed.test -connect "+ip1+":443"+testCA, 1, "")
	expect(t, sb, "tcp "+ip1+":7", 1, "")
	expect(t, sb, "udp "+ip1+":443", 1, "")
	// The sandbox trusts its egress CA through the usual variables.
	env1 := MustRun(t, sb, "env")
	for _, v := range []string{"SSL_CERT_FILE=", "REQUESTS_CA_BUNDLE=", "NODE_EXTRA_CA_CERTS=", "GIT_SSL_CAINFO="} {
		if !strings.Contains(env1, v) {
			t.Errorf("sandbox env lacks %s", v)
		}
	}
	if got := MustRun(t, sb, "cat /etc/resolv.conf"); !strings.Contains(got, "nameserver 198.1") {
		t.Errorf("resolv.conf = %q, want the gateway", got)
	}
}

func TestEgressAllow(t *testing.T) {
	env := startEgress(t)
	ip1, ip2, hostIP := env.tn.IP.String(), env.tn.IP2.String(), env.tn.HostIP.String()
	_, _, _ = ip1, ip2, hostIP
	pol := &client.NetworkPolicy{
		Mode:  client.NetAllow,
		Allow: []string{"allowed.test", "*.wild.test", "rebind.test", "meta.test", ip1 + ":7"},
		Deny:  []string{"bad.wild.test"},
		HTTP:  []client.HTTPRule{{Host: "api.test", Methods: []string{"GET", "HEAD"}, Path: "/v1/"}},
	}
	sb := env.sandbox(t, pol)
	other := env.d.Create(t, client.CreateRequest{})

	// DNS: allowed names resolve through the gateway, others are refused,
	// forbidden answers are stripped, other servers are unreachable.
	expect(t, sb, "dns allowed.test", 0, ip1)
	expect(t, sb, "dns other.test", 1, "")
	expect(t, sb, "dns rebind.test", 1, "")
	expect(t, sb, "dns allowed.test -server "+ip1+":53", 1, "")
	expect(t, sb, "dns allowed.test -server 8.8.8.8:53", 1, "")

	// HTTPS pass-through by SNI (the test net's own certificate).
	expect(t, sb, "https allowed.test"+testCA, 0, "host=allowed.test method=GET path=/ tls=true")
	expect(t, sb, "https sub.wild.test -connect "+ip1+":443"+testCA, 0, "host=sub.wild.test")
	expect(t, sb, "https wild.test -connect "+ip1+":443"+testCA, 1, "")     // apex of a wildcard
	expect(t, sb, "https bad.wild.test -connect "+ip1+":443"+testCA, 1, "") // deny wins
	expect(t, sb, "https other.test -connect "+ip1+":443"+testCA, 1, "")
	// IP literals: no SNI, or an address as the name, decide by CIDR.
	expect(t, sb, "https "+ip1+testCA, 1, "")
	expect(t, sb, "https "+ip1+" -sni ''", 1, "")
	// Rebinding: the proxy resolves rebind.test itself, finds 127.0.0.1, refuses.
	expect(t, sb, "https rebind.test -connect "+ip1+":443"+testCA, 1, "")
	expect(t, sb, "http meta.test -connect "+ip1+":80", 2, "403")
	// Plain HTTP by Host.
	expect(t, sb, "http allowed.test -connect "+ip1+":80", 0, "host=allowed.test method=GET path=/ tls=false")
	expect(t, sb, "http other.test -connect "+ip1+":80", 2, "403")
	expect(t, sb, "http "+ip1+" -connect "+ip1+":80", 2, "403")
	expect(t, sb, "http [2001:db8::1] -connect "+ip1+":80", 2, "403")
	// IPv6 literals: the sandbox has no IPv6 at all.
	expect(t, sb, "https [2001:db8::1]"+testCA, 1, "")
	// Intercepted HTTPS: the sandbox's CA, method and path rules, Host = SNI.
	expect(t, sb, "https api.test -path /v1/users", 0, "issuer=Berth egress CA")
	expect(t, sb, "https api.test -path /v1/users", 0, "host=api.test method=GET path=/v1/users tls=true")
	expect(t, sb, "https api.test -method POST -path /v1/users", 2, "403")
	expect(t, sb, "https api.test -path /v2/", 2, "403")
	expect(t, sb, "https api.test -host allowed.test -path /v1/", 2, "421")
	// Host ≠ SNI on pass-through cannot be checked, but a mismatched SNI
	// with an allowed Host is decided on the SNI.
	expect(t, sb, "https other.test -connect "+ip1+":443 -host allowed.test"+testCA, 1, "")
	// Other TCP ports only by CIDR:port.
	expect(t, sb, "tcp "+ip1+":7", 0, "ping")
	expect(t, sb, "tcp "+ip2+":7", 1, "")
	// QUIC and DNS-over-TLS never leave.
	expect(t, sb, "udp "+ip1+":443", 1, "")
	expect(t, sb, "tcp "+ip1+":853", 1, "")
	// The gateway, the host's services, metadata and other sandboxes.
	gw := strings.TrimSpace(MustRun(t, sb, "ip route | awk '/default/ {print $3}'"))
	otherIP := strings.TrimSpace(MustRun(t, other, "ip -4 -o addr show eth0 | awk '{print $4}' | cut -d/ -f1"))
	for _, target := range []string{gw + ":22", gw + ":15001", gw + ":49983", "127.0.0.1:" + strings.Split(env.d.Addr, ":")[1],
		hostIP + ":7", "169.254.169.254:80", otherIP + ":49983"} {
		expect(t, sb, "tcp "+target, 1, "")
	}
	expect(t, sb, "http "+gw+" -connect "+gw+":80", 2, "403")

	// DNS to 8.8.8.8 was dropped on the host: the firewall's counter saw it
	// (and nothing routes there from the sandbox anyway).
	out, err := exec.Command("nft", "list", "chain", "inet", "berth_"+env.d.Instance, "sbx-"+sb.ID).CombinedOutput()
	if err != nil {
		t.Fatalf("nft: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`udp dport 53 counter packets (\d+)`).FindSubmatch(out)
	if m == nil || atoi(string(m[1])) == 0 {
		t.Errorf("no dropped DNS counted in the sandbox chain:\n%s", out)
	}

	// The audit log has the decisions, with rules, bytes and requests.
	recs, err := env.d.Client.NetworkLog(context.Background(), sb.ID, false)
	if err != nil {
		t.Fatal(err)
	}
	find := func(pred func(client.NetworkRecord) bool) *client.NetworkRecord {
		for i := range recs {
			if pred(recs[i]) {
				return &recs[i]
			}
		}
		return nil
	}
	// allowed.test shares its address with api.test, which has HTTP rules,
	// so its TLS is intercepted too (and its Host held to its SNI).
	if r := find(func(r client.NetworkRecord) bool {
		return r.Proto == "https" && r.Name == "allowed.test" && r.Decision == "allow"
	}); r == nil || r.BytesIn == 0 || r.BytesOut == 0 || r.Rule != "allow allowed.test" || r.IP != ip1 || r.Port != 443 {
		t.Errorf("audit record for allowed.test = %+v", r)
	}
	if r := find(func(r client.NetworkRecord) bool {
		return r.Proto == "https" && r.Method == "POST" && r.Path == "/v1/users"
	}); r == nil || r.Decision != "deny" {
		t.Errorf("audit record for the denied POST = %+v", r)
	}
	if r := find(func(r client.NetworkRecord) bool { return r.Name == "rebind.test" && r.Proto == "tls" }); r == nil || r.Decision != "deny" || !strings.Contains(r.Reason, "127.0.0.1") {
		t.Errorf("audit record for rebind.test = %+v", r)
	}
	denied, err := env.d.Client.NetworkLog(context.Background(), sb.ID, true)
	if err != nil || len(denied) == 0 || len(denied) >= len(recs) {
		t.Errorf("denied-only log: %d of %d records, %v", len(denied), len(recs), err)
	}
	stdout, _, code := env.d.CLI(t, nil, "net", "log", sb.ID, "--denied")
	if code != 0 || !strings.Contains(stdout, "other.test") || strings.Contains(stdout, "Z  allow ") {
		t.Errorf("berth net log --denied: exit %d\n%s", code, stdout)
	}
}

func TestEgressSetAtRuntime(t *testing.T) {
	env := startEgress(t)
	ip1, ip2, hostIP := env.tn.IP.String(), env.tn.IP2.String(), env.tn.HostIP.String()
	_, _, _ = ip1, ip2, hostIP
	ctx := context.Background()
	sb := env.sandbox(t, &client.NetworkPolicy{Mode: client.NetAllow, Allow: []string{"allowed.test"}})
	expect(t, sb, "https allowed.test"+testCA, 0, "host=allowed.test")

	// Bad input: 400 naming the entry; the old policy stays.
	_, err := env.d.Client.SetNetworkPolicy(ctx, sb.ID, client.NetworkPolicy{Mode: client.NetAllow, Allow: []string{"ok.test", "foo..bar"}})
	if client.ErrorCode(err) != "invalid_argument" || !strings.Contains(err.Error(), "allow[1]") {
		t.Errorf("bad policy: %v; want invalid_argument naming allow[1]", err)
	}
	for _, bad := range []client.NetworkPolicy{
		{Mode: "sometimes"},
		{Mode: client.NetAllow, Allow: []string{"198.51.100.0/33"}},
		{Mode: client.NetAllow, Allow: []string{ip1 + ":99999"}},
		{Mode: client.NetAllow, HTTP: []client.HTTPRule{{Host: "a.test", Methods: []string{"G T"}, Path: "/"}}},
		{Mode: client.NetAllow, HTTP: []client.HTTPRule{{Host: "a.test", Methods: []string{"GET"}, Path: "nope"}}},
	} {
		if _, err := env.d.Client.SetNetworkPolicy(ctx, sb.ID, bad); client.ErrorCode(err) != "invalid_argument" {
			t.Errorf("SetNetworkPolicy(%+v) = %v, want invalid_argument", bad, err)
		}
	}
	if p, err := env.d.Client.NetworkPolicy(ctx, sb.ID); err != nil || p.Mode != client.NetAllow || len(p.Allow) != 1 {
		t.Errorf("policy after bad input = %+v, %v; want the old one", p, err)
	}
	_, stderr, code := env.d.CLI(t, nil, "net", "set", sb.ID, "--allow", "bad..name")
	if code == 0 || !strings.Contains(stderr, "allow[0]") {
		t.Errorf("berth net set with a bad entry: exit %d, %s", code, stderr)
	}

	// Closing applies to the next connection, without a restart: the
	// probes right after the call are the proof (how fast the call is,
	// is bench's business).
	if _, err := env.d.Client.SetNetworkPolicy(ctx, sb.ID, client.NetworkPolicy{Mode: client.NetNone}); err != nil {
		t.Fatal(err)
	}
	expect(t, sb, "https allowed.test -connect "+ip1+":443"+testCA, 1, "")
	expect(t, sb, "dns allowed.test", 1, "")

	// Open: the public (test) internet, never loopback or metadata.
	stdout, stderr, code := env.d.CLI(t, nil, "net", "set", sb.ID, "--net", "open", "--deny", "second.test")
	if code != 0 {
		t.Fatalf("berth net set --net open: %d %s", code, stderr)
	}
	if !strings.Contains(stdout, "mode: open") {
		t.Errorf("net set printed %q", stdout)
	}
	expect(t, sb, "https other.test"+testCA, 0, "host=other.test")
	expect(t, sb, "tcp "+ip2+":7", 0, "ping")
	expect(t, sb, "https second.test -connect "+ip2+":443"+testCA, 1, "")
	expect(t, sb, "https rebind.test -connect "+ip1+":443"+testCA, 1, "")
	expect(t, sb, "tcp 169.254.169.254:80", 1, "")
	expect(t, sb, "udp "+ip1+":443", 1, "")
	stdout, _, code = env.d.CLI(t, nil, "net", "show", sb.ID)
	if code != 0 || !strings.Contains(stdout, "mode: open") || !strings.Contains(stdout, "second.test") {
		t.Errorf("berth net show: %d\n%s", code, stdout)
	}
}

func TestEgressLearnSuggest(t *testing.T) {
	env := startEgress(t)
	ip1, ip2, hostIP := env.tn.IP.String(), env.tn.IP2.String(), env.tn.HostIP.String()
	_, _, _ = ip1, ip2, hostIP
	stdout, stderr, code := env.d.CLI(t, nil, "create", "--template", "minimal", "--net", "learn")
	if code != 0 {
		t.Fatalf("berth create --net learn: %d %s", code, stderr)
	}
	sb := env.d.Client.Sandbox(strings.TrimSpace(stdout))
	env.install(t, sb)
	expect(t, sb, "https learned.test"+testCA, 1, "")
	expect(t, sb, "https other.test -connect "+ip1+":443"+testCA, 1, "")
	expect(t, sb, "tcp "+ip1+":7", 1, "")
	expect(t, sb, "tcp 127.0.0.1:1", 1, "") // loopback inside: never suggested

	stdout, stderr, code = env.d.CLI(t, nil, "net", "suggest", sb.ID)
	if code != 0 {
		t.Fatalf("berth net suggest: %d %s", code, stderr)
	}
	for _, want := range []string{"mode: allow", "learned.test", "other.test", ip1 + "/32:7"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("suggestion lacks %q:\n%s", want, stdout)
		}
	}
	// Fed back, it lets exactly that through.
	file := filepath.Join(t.TempDir(), "policy.yaml")
	os.WriteFile(file, []byte(stdout), 0o644)
	if _, stderr, code := env.d.CLI(t, nil, "net", "set", sb.ID, "--net-policy", file); code != 0 {
		t.Fatalf("berth net set --net-policy: %d %s", code, stderr)
	}
	expect(t, sb, "https learned.test"+testCA, 0, "host=learned.test")
	expect(t, sb, "tcp "+ip1+":7", 0, "ping")
	expect(t, sb, "https allowed.test -connect "+ip1+":443"+testCA, 1, "")
}

func TestEgressRestartAndLeaks(t *testing.T) {
	env := startEgress(t)
	ip1, ip2, hostIP := env.tn.IP.String(), env.tn.IP2.String(), env.tn.HostIP.String()
	_, _, _ = ip1, ip2, hostIP
	ctx := context.Background()
	sb := env.sandbox(t, &client.NetworkPolicy{Mode: client.NetAllow, Allow: []string{"allowed.test"},
		HTTP: []client.HTTPRule{{Host: "api.test", Methods: []string{"GET"}, Path: "/"}}})
	expect(t, sb, "https api.test", 0, "host=api.test")
	stateDir := filepath.Join(env.d.DataDir, "egress", sb.ID)
	if fi, err := os.Stat(filepath.Join(stateDir, "ca.key")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("CA key: %v %v; want a 0600 file", fi, err)
	}

	// SIGKILL and restart: the policy, resolver and proxy come back.
	env.d.Kill9()
	env.d.Start()
	expect(t, sb, "dns allowed.test", 0, ip1)
	expect(t, sb, "https allowed.test"+testCA, 0, "host=allowed.test")
	expect(t, sb, "https api.test", 0, "issuer=Berth egress CA")
	expect(t, sb, "https other.test -connect "+ip1+":443"+testCA, 1, "")
	if p, err := env.d.Client.NetworkPolicy(ctx, sb.ID); err != nil || p.Mode != client.NetAllow {
		t.Errorf("policy after restart = %+v, %v", p, err)
	}

	// A failed create (bad policy) leaves nothing; destroy removes the CA.
	_, err := env.d.Client.Create(ctx, client.CreateRequest{Template: "minimal", Network: &client.NetworkPolicy{Mode: client.NetAllow, Deny: []string{"10.0.0.0/40"}}})
	if client.ErrorCode(err) != "invalid_argument" || !strings.Contains(err.Error(), "deny[0]") {
		t.Errorf("create with a bad policy: %v", err)
	}
	if err := env.d.Client.Kill(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(stateDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("egress state (CA key) left after destroy: %v", err)
	}
	// The decision record outlives the sandbox.
	if recs, err := env.d.Client.NetworkLog(ctx, sb.ID, false); err != nil || len(recs) == 0 {
		t.Errorf("audit log after destroy: %d records, %v", len(recs), err)
	}
	ents, _ := os.ReadDir(filepath.Join(env.d.DataDir, "egress"))
	if len(ents) != 0 {
		t.Errorf("egress state dir not empty: %v", ents)
	}
}
