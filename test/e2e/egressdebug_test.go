package e2e

import (
	"testing"
	"time"

	"github.com/berth-sandbox/berth/client"
)

func TestEgressDebug(t *testing.T) {
	env := startEgress(t)
	sb := env.sandbox(t, &client.NetworkPolicy{Mode: client.NetAllow, Allow: []string{"allowed.test", "meta.test"}})
	for _, a := range []string{"dns allowed.test -server 8.8.8.8:53", "http meta.test -connect 198.51.100.1:80", "dns allowed.test -server 8.8.8.8:53", "http allowed.test -connect 198.51.100.1:80", "http meta.test -connect 198.51.100.1:80", "sleep 6; echo hi"} {
		start := time.Now()
		o, e, c := Run(t, sb, "/tmp/egressprobe "+a+"; echo rc=$?")
		t.Logf("%s: %s out=%q err=%q code=%d", a, time.Since(start), o, e, c)
	}
}
