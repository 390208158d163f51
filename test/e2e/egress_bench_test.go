package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/client"
)

// BenchmarkEgressProxy measures, in one run, the egress proxy's added
// latency for a fresh HTTPS request (pass-through and intercepted) and its
// bulk throughput, against a direct connection from the host to the same
// test-net server. It reports metrics rather than ns/op:
//
//	go test ./test/e2e -run '^$' -bench EgressProxy -benchtime 1x
func BenchmarkEgressProxy(b *testing.B) {
	env := startEgress(b)
	sb := env.d.Create(b, client.CreateRequest{Network: &client.NetworkPolicy{Mode: client.NetAllow,
		Allow: []string{"bench.test", "second.test"},
		HTTP:  []client.HTTPRule{{Host: "benchapi.test", Methods: []string{"GET"}, Path: "/"}}}})
	env.install(b, sb)
	const n = 50
	median := func(script string) float64 {
		out := MustRun(b, sb, script)
		m := regexp.MustCompile(`median_us=(\d+)`).FindStringSubmatch(out)
		if m == nil {
			b.Fatalf("%s: %s", script, out)
		}
		v, _ := strconv.Atoi(m[1])
		return float64(v) / 1000
	}
	// second.test has an address of its own, so it passes through;
	// bench.test shares benchapi.test's address (which has HTTP rules), so
	// it is intercepted too.
	pass := median("/tmp/egressprobe lat second.test -n " + strconv.Itoa(n) + " -ca /tmp/testca.pem")
	icpt := median("/tmp/egressprobe lat benchapi.test -n " + strconv.Itoa(n))
	shared := median("/tmp/egressprobe lat bench.test -n " + strconv.Itoa(n) + " -ca /tmp/testca.pem")
	direct := hostLatency(b, env, n)
	mbps := func(script string) float64 {
		out := MustRun(b, sb, script)
		m := regexp.MustCompile(`mbps=(\d+)`).FindStringSubmatch(out)
		if m == nil {
			b.Fatalf("%s: %s", script, out)
		}
		v, _ := strconv.Atoi(m[1])
		return float64(v)
	}
	const size = 256 << 20
	proxied := mbps("/tmp/egressprobe bulk https://second.test/bulk?n=" + strconv.Itoa(size) + " -ca /tmp/testca.pem")
	directMbps := hostBulk(b, env, size)
	b.ReportMetric(direct, "direct-ms")
	b.ReportMetric(pass, "passthrough-ms")
	b.ReportMetric(icpt, "intercepted-ms")
	b.ReportMetric(shared, "shared-address-ms")
	b.ReportMetric(directMbps, "direct-Mbps")
	b.ReportMetric(proxied, "proxied-Mbps")
	b.Logf("fresh HTTPS request, median of %d: direct %.2fms, through the proxy %.2fms (pass-through), %.2fms (intercepted), %.2fms (intercepted for a shared address); bulk: direct %.0f Mbit/s, proxied %.0f Mbit/s",
		n, direct, pass, icpt, shared, directMbps, proxied)
}

func hostClient(env *egressEnv) *http.Client {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(env.tn.CAPEM)
	return &http.Client{Transport: &http.Transport{
		TLSClientConfig:   &tls.Config{RootCAs: pool},
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", env.tn.IP.String()+":443")
		},
	}}
}

func hostLatency(b *testing.B, env *egressEnv, n int) float64 {
	c := hostClient(env)
	var ds []time.Duration
	for range n {
		start := time.Now()
		resp, err := c.Get("https://bench.test/")
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		ds = append(ds, time.Since(start))
	}
	slices.Sort(ds)
	return float64(ds[len(ds)/2].Microseconds()) / 1000
}

func hostBulk(b *testing.B, env *egressEnv, size int) float64 {
	c := hostClient(env)
	start := time.Now()
	resp, err := c.Get("https://bench.test/bulk?n=" + strconv.Itoa(size))
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	got, _ := io.Copy(io.Discard, resp.Body)
	return float64(got) * 8 / 1e6 / time.Since(start).Seconds()
}
