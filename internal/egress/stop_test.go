package egress

import (
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/internal/audit"
	"github.com/berth-sandbox/berth/internal/policy"
)

// A sandbox whose create fails right after its egress services started
// (before their goroutines ever ran, as on a loaded host) is removed
// without hanging: the resolver, which refuses Shutdown until it has
// started, ends anyway.
func TestStopRightAfterStart(t *testing.T) {
	if testing.Short() {
		t.Skip("binds port 53 on a loopback address")
	}
	al, err := audit.New(audit.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	e, err := New(Config{StateDir: t.TempDir(), Audit: al, Upstream: []string{"127.0.0.1:1"}, Guard: &policy.Guard{}, ProxyPort: 18081})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	// One P: the services' goroutines cannot run between Start and
	// Remove, which is the order that hung.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	host := netip.MustParseAddr("127.77.0.2")
	for i := range 20 {
		if err := e.Start(t.Context(), "sbstop", host, policy.Policy{Mode: policy.ModeAllow}); err != nil {
			t.Skipf("cannot listen on %s: %v", host, err)
		}
		done := make(chan error, 1)
		go func() { done <- e.Remove("sbstop") }()
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(time.Minute): // a bound, not a measurement
			t.Fatalf("round %d: Remove right after Start did not return", i)
		}
	}
}
