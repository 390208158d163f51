// Package hostile is Berth's hostile test suite: attacks run from inside
// real sandboxes of a real daemon (runc, user namespaces, seccomp, cgroups,
// nftables), each with its expected outcome asserted and the host checked
// afterwards: planted host files unchanged, no process of the sandbox uid
// range outside a sandbox cgroup, no new host mounts, the agent binary and
// a neighbouring sandbox's files untouched. It needs root and runc; it
// skips, saying which, when either is missing.
package hostile

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/berth-sandbox/berth/test/harness"
)

var (
	bin harness.Binaries
	// attackerBin is the static attack tool (./attacker) built for the
	// sandboxes.
	attackerBin string
)

func TestMain(m *testing.M) {
	os.Exit(harness.Main(m, &bin, func(b harness.Binaries) error {
		attackerBin = filepath.Join(b.Dir, "attacker")
		cmd := exec.Command("go", "build", "-o", attackerBin, "./attacker")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("build attacker: %v\n%s", err, out)
		}
		return nil
	}))
}
