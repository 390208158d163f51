package netpolicy

import (
	"errors"

	"github.com/vishvananda/netlink"
)

// dumpRetries bounds how often a netlink dump is repeated.
const dumpRetries = 20

// redump runs a netlink dump until it is consistent. The kernel flags a
// dump that raced a change (a link or address added or removed meanwhile,
// which many concurrent creates and destroys do all the time) and the
// library returns its partial result with ErrDumpInterrupted; a partial
// list would make a link look missing or an address free.
func redump[T any](dump func() (T, error)) (T, error) {
	var (
		v   T
		err error
	)
	for range dumpRetries {
		v, err = dump()
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			return v, err
		}
	}
	return v, err
}
