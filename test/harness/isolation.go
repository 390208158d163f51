package harness

import (
	"context"
	"fmt"
	"os/exec"
	"testing"

	"github.com/berth-sandbox/berth/client"
)

// Isolations are the levels the e2e and hostile suites run at: runc
// always, gvisor when runsc is installed (scripts/deps.sh installs it;
// without it a gvisor case skips saying so).
func Isolations() []string { return []string{client.IsolationRunc, client.IsolationGVisor} }

// RequireIsolation skips a gvisor case on a host without runsc.
func RequireIsolation(t TB, iso string) {
	t.Helper()
	if iso != client.IsolationGVisor {
		return
	}
	if _, err := exec.LookPath("runsc"); err != nil {
		t.Skip("gvisor level: runsc is not installed (apt-get install runsc; scripts/deps.sh)")
	}
}

// ForEachIsolation runs fn as one subtest per isolation level.
func ForEachIsolation(t *testing.T, fn func(t *testing.T, iso string)) {
	t.Helper()
	for _, iso := range Isolations() {
		t.Run(iso, func(t *testing.T) {
			RequireIsolation(t, iso)
			fn(t, iso)
		})
	}
}

// SudoTakesEffect reports whether allow_sudo raises processes at level
// iso on d, as the daemon reports the level (GET /v1/health: its sudo);
// when it does not, why names the runtime. Under gVisor that takes a
// runsc with --allow-suid: Debian's 20221219 ignores set-user-ID bits.
func SudoTakesEffect(t TB, d *Daemon, iso string) (ok bool, why string) {
	t.Helper()
	h, err := d.Client.Health(context.Background())
	if err != nil {
		t.Fatalf("health: %v", err)
	}
	for _, l := range h.Isolation {
		if l.Name == iso {
			return l.Sudo, fmt.Sprintf("allow_sudo has no effect at %s on %s (a runsc without --allow-suid ignores set-user-ID bits)", iso, l.Runtime)
		}
	}
	t.Fatalf("health lists no isolation level %s: %+v", iso, h.Isolation)
	return false, ""
}
