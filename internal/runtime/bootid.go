package runtime

import (
	"os"
	"strings"
)

// HostBootID is the kernel's ID of the host's current boot: what a record
// kept on disk names to tell this boot from an earlier one (a cache the
// boot invalidates, a checkpoint whose flush a host restart cut short).
func HostBootID() (string, error) {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}
