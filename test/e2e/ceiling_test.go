package e2e

import (
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/test/harness"
)

// TestEgressCeiling: the operator's ceiling (configured explicitly, as the
// test net's TEST-NET addresses are not in the default one) bounds every
// policy. Mode open cannot reach a ceiling-denied test host, by address or
// by name, and the firewall refuses it before the proxy; a policy naming it
// is refused at create and at update, naming the entry and the ceiling
// entry; an allowed host still works; and under e2b_default_network: none
// an E2B create asking for internet access gets no egress.
func TestEgressCeiling(t *testing.T) {
	harness.RequireHost(t)
	tn := harness.StartTestNet(t)
	env := &egressEnv{tn: tn, probe: buildProbe(t)}
	args := tn.ConfigFile(t)
	cfg, err := os.ReadFile(args[1])
	if err != nil {
		t.Fatal(err)
	}
	ip1, ip2 := tn.IP.String(), tn.IP2.String()
	cfg = append(cfg, []byte("e2b_default_network: none\negress_ceiling:\n  deny: [\""+ip2+"\", second.test]\n")...)
	if err := os.WriteFile(args[1], cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	env.d = harness.StartDaemon(t, bin, args...)
	d := env.d

	open := env.sandbox(t, &client.NetworkPolicy{Mode: client.NetOpen})
	expect(t, open, "https allowed.test -connect "+ip1+":443"+testCA, 0, "host=allowed.test")
	expect(t, open, "tcp "+ip1+":7", 0, "ping")
	expect(t, open, "tcp "+ip2+":7", 1, "")
	expect(t, open, "https second.test -connect "+ip2+":443"+testCA, 1, "")
	expect(t, open, "http second.test -connect "+ip1+":80", 2, "403")
	expect(t, open, "dns second.test", 1, "")
	// The firewall refused the connections to the denied address itself.
	out, err := exec.Command("nft", "list", "chain", "inet", d.NftTable(), "sbx-"+open.ID).CombinedOutput()
	if err != nil {
		t.Fatalf("nft: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`ip daddr ` + regexp.QuoteMeta(ip2) + ` counter packets (\d+)`).FindSubmatch(out)
	if m == nil || atoi(string(m[1])) == 0 {
		t.Errorf("no refusal counted by the ceiling's firewall rule for %s:\n%s", ip2, out)
	}

	// A policy naming the denied host is refused, at create and update.
	for _, allow := range [][]string{{ip1 + ":7", ip2}, {"allowed.test", "second.test"}} {
		_, err := d.Client.Create(t.Context(), client.CreateRequest{Network: &client.NetworkPolicy{Mode: client.NetAllow, Allow: allow}})
		var we *errdefs.Error
		if !errors.Is(err, errdefs.ErrPermissionDenied) || !errors.As(err, &we) || we.Field != "network.allow[1]" || !strings.Contains(err.Error(), "egress_ceiling.deny[") {
			t.Errorf("create allowing %v = %v, want permission denied naming network.allow[1] and the ceiling entry", allow, err)
		}
	}
	_, err = d.Client.SetNetworkPolicy(t.Context(), open.ID, client.NetworkPolicy{Mode: client.NetAllow, Allow: []string{ip2 + ":7"}})
	if we := (*errdefs.Error)(nil); !errors.Is(err, errdefs.ErrPermissionDenied) || !errors.As(err, &we) || we.Field != "network.allow[0]" {
		t.Errorf("update allowing %s = %v, want permission denied naming network.allow[0]", ip2, err)
	}
	_, stderr, code := d.CLI(t, nil, "create", "--allow", "10.1.2.3")
	if code == 0 || !strings.Contains(stderr, "10.0.0.0/8") {
		t.Errorf("berth create --allow 10.1.2.3: exit %d, %q; want refused naming the default ceiling's 10.0.0.0/8", code, stderr)
	}

	// An allowed host under an allow policy still works.
	allowed := env.sandbox(t, &client.NetworkPolicy{Mode: client.NetAllow, Allow: []string{"allowed.test", ip1 + ":7"}})
	expect(t, allowed, "https allowed.test"+testCA, 0, "host=allowed.test")
	expect(t, allowed, "tcp "+ip1+":7", 0, "ping")

	// The audit log names the ceiling.
	recs, err := d.Client.NetworkLog(t.Context(), open.ID, true)
	if err != nil {
		t.Fatal(err)
	}
	var sawCeiling bool
	for _, r := range recs {
		sawCeiling = sawCeiling || strings.Contains(r.Rule, "ceiling") || strings.Contains(r.Reason, "ceiling")
	}
	if !sawCeiling {
		t.Errorf("no denial in the audit log names the ceiling: %+v", recs)
	}

	// E2B: allow_internet_access: true means nothing under
	// e2b_default_network: none.
	key := createKey(t, d, "ceiling")
	status, body := sendWithKey(t, http.MethodPost, d.URL+"/sandboxes", key, `{"templateID":"minimal","timeout":120,"allow_internet_access":true}`)
	if status != http.StatusCreated {
		t.Fatalf("E2B create = %d %s", status, body)
	}
	var created struct {
		SandboxID string `json:"sandboxID"`
	}
	if err := json.Unmarshal([]byte(body), &created); err != nil {
		t.Fatal(err)
	}
	e2b, err := d.Client.Get(t.Context(), created.SandboxID)
	if err != nil {
		t.Fatal(err)
	}
	if p, err := d.Client.NetworkPolicy(t.Context(), e2b.ID); err != nil || p.Mode != client.NetNone {
		t.Errorf("E2B sandbox with internet under e2b_default_network none: policy %+v, %v; want mode none", p, err)
	}
	env.install(t, e2b)
	expect(t, e2b, "https allowed.test -connect "+ip1+":443"+testCA, 1, "")
	expect(t, e2b, "tcp "+ip1+":7", 1, "")
	status, body = getWithKey(t, d.URL+"/sandboxes/"+e2b.ID, key)
	if status != http.StatusOK || !strings.Contains(body, `"allowInternetAccess":false`) {
		t.Errorf("E2B getInfo = %d %s, want allowInternetAccess false", status, body)
	}
	d.DestroyAll()
	AssertNoLeaks(t, d)
}
