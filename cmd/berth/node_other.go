//go:build !linux

package main

import (
	"fmt"
	"runtime"

	"github.com/spf13/cobra"
)

// newNodeCmd on a non-Linux build: a node runs the daemon, which needs
// Linux.
func newNodeCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "node",
		Short: "Run the Berth daemon as a Kubernetes node (Linux only)",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			return fmt.Errorf("berth node runs only on Linux (this is a %s/%s build)", runtime.GOOS, runtime.GOARCH)
		},
	}
}
