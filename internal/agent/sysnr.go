package agent

import "golang.org/x/sys/unix"

// syscallNumbers are the calls Deny knows by name on this
// architecture: those the runtime's seccomp profile answers with an errno
// other than EPERM (internal/runtime/runc/seccomp.go).
var syscallNumbers = map[string]uint32{
	"clone3":        unix.SYS_CLONE3,
	"io_setup":      unix.SYS_IO_SETUP,
	"io_destroy":    unix.SYS_IO_DESTROY,
	"io_submit":     unix.SYS_IO_SUBMIT,
	"io_cancel":     unix.SYS_IO_CANCEL,
	"io_getevents":  unix.SYS_IO_GETEVENTS,
	"io_pgetevents": unix.SYS_IO_PGETEVENTS,
}
