package main

import (
	"strings"
	"testing"
)

// TestNodeLocalValidation: berth node refuses a bad API rate or back-off
// with a message naming the flag, before it starts anything.
func TestNodeLocalValidation(t *testing.T) {
	base := []string{"node", "--kubeconfig", "/nonexistent", "--tls-cert", "c", "--tls-key", "k", "--client-ca", "ca"}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--kube-api-qps", "0"}, "--kube-api-qps"},
		{[]string{"--kube-api-qps", "-5"}, "--kube-api-qps"},
		{[]string{"--kube-api-burst", "0"}, "--kube-api-burst"},
		{[]string{"--restart-backoff", "0s"}, "--restart-backoff"},
		{[]string{"--restart-backoff", "1m", "--restart-backoff-max", "10s"}, "--restart-backoff"},
		{[]string{"--config-sync-period", "10ms"}, "--config-sync-period"},
	} {
		code, _, stderr := runBerth(t, "http://127.0.0.1:1", append(base, c.args...)...)
		if code == 0 || !strings.Contains(stderr, c.want) || !strings.Contains(stderr, "invalid_argument") {
			t.Errorf("berth node %v = %d, %q; want invalid_argument naming %s", c.args, code, stderr, c.want)
		}
	}
}
