package main

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// asUserViaSetuid becomes uid 1000 (as an agent's "user" would be) and
// runs the attack args[0] (or none: it reports its uids) through /tmp/suid, a set-uid-root copy of this
// tool the test made: the attack then runs raised, as sudo would raise
// it. With no_new_privs the raise does not happen and the attack runs as
// uid 1000.
func asUserViaSetuid(args []string) {
	if err := unix.Setgroups(nil); err != nil {
		failed("setgroups: %v", err)
	}
	if err := unix.Setresgid(1000, 1000, 1000); err != nil {
		failed("setresgid: %v", err)
	}
	if err := unix.Setresuid(1000, 1000, 1000); err != nil {
		failed("setresuid: %v", err)
	}
	err := unix.Exec("/tmp/suid", append([]string{"/tmp/suid", "raised"}, args...), os.Environ())
	failed("exec /tmp/suid: %v", err)
}

// raised reports the uids it runs with, then runs the attack.
func raised(args []string) {
	fmt.Printf("raised: ruid=%d euid=%d\n", unix.Getuid(), unix.Geteuid())
	if len(args) == 0 {
		os.Exit(0)
	}
	fn, ok := table()[args[0]]
	if !ok {
		failed("raised: unknown attack %q", args[0])
	}
	fn(args[1:])
}
