package main

import (
	"bufio"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/berth-sandbox/berth/errdefs"
)

func newRegistryCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "registry",
		Short: "Registry credentials the daemon pulls image templates with",
	}
	var user string
	var passStdin bool
	login := &cobra.Command{
		Use:   "login HOST -u USER --password-stdin",
		Short: "Give the daemon credentials for a registry (checked against it first)",
		Long: `Give the daemon credentials for pulling from a registry (host[:port]).

The daemon checks them against the registry, as docker login does, and
keeps them root-only in its data dir (registry-auth.json, in the format of
Docker's config.json); they are used before the daemon user's
~/.docker/config.json. The password is read from stdin, never from the
command line.`,
		Args: exactArgs(1, "a registry host"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if user == "" {
				return fmt.Errorf("--username (-u) is required: %w", errdefs.ErrInvalidArgument)
			}
			if !passStdin {
				return fmt.Errorf("--password-stdin is required (a password on the command line would show in ps and shell history): %w", errdefs.ErrInvalidArgument)
			}
			line, err := bufio.NewReader(io.LimitReader(a.in, 64<<10+2)).ReadString('\n')
			if err != nil && err != io.EOF {
				return err
			}
			pass := strings.TrimRight(line, "\r\n")
			if pass == "" {
				return fmt.Errorf("no password on stdin: %w", errdefs.ErrInvalidArgument)
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			l, err := c.LoginRegistry(cmd.Context(), args[0], user, pass)
			if err != nil {
				return err
			}
			fmt.Fprintf(a.out, "logged in to %s as %s\n", l.Registry, l.Username)
			return nil
		},
	}
	login.Flags().StringVarP(&user, "username", "u", "", "user name")
	login.Flags().BoolVar(&passStdin, "password-stdin", false, "read the password from stdin")
	logout := &cobra.Command{
		Use:   "logout HOST",
		Short: "Make the daemon forget its credentials for a registry",
		Args:  exactArgs(1, "a registry host"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			if err := c.LogoutRegistry(cmd.Context(), args[0]); err != nil {
				return err
			}
			fmt.Fprintf(a.out, "logged out of %s\n", args[0])
			return nil
		},
	}
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List the registries the daemon has credentials for",
		Args:  exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			rs, err := c.Registries(cmd.Context())
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(a.out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "REGISTRY\tUSERNAME")
			for _, r := range rs {
				fmt.Fprintf(tw, "%s\t%s\n", r.Registry, r.Username)
			}
			return tw.Flush()
		},
	}
	cmd.AddCommand(login, logout, ls)
	return cmd
}
