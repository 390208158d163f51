//go:build !linux

package main

import (
	"fmt"
	"runtime"

	"github.com/spf13/cobra"
)

// newServeCmd on a non-Linux build: the CLI works as a client of a remote
// daemon (BERTH_URL), but the daemon needs Linux namespaces, cgroups and
// nftables, so `serve` says so instead of pretending.
func newServeCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "serve",
		Short: "Run the Berth daemon (Linux only)",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			return fmt.Errorf("berth serve runs only on Linux (this is a %s/%s build): run the daemon on a Linux host and point BERTH_URL at it", runtime.GOOS, runtime.GOARCH)
		},
	}
}
