package main

import (
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
)

// newAPIKeyCmd manages the keys of the E2B-compatible API.
func newAPIKeyCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "apikey",
		Short: "Manage API keys of the E2B-compatible API (E2B_API_KEY)",
		Args:  cobra.NoArgs,
	}
	var name string
	create := &cobra.Command{
		Use:   "create [--name NAME]",
		Short: "Create an API key and print it (it is shown only once)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			k, err := c.CreateAPIKey(cmd.Context(), name)
			if err != nil {
				return err
			}
			// The key alone on stdout, so `export E2B_API_KEY=$(berth apikey create)` works.
			fmt.Fprintln(a.out, k.Key)
			fmt.Fprintf(a.err, "created API key %s; it is not stored and cannot be shown again\n", k.ID)
			return nil
		},
	}
	create.Flags().StringVar(&name, "name", "", "a name to recognise the key by")
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List API keys",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			keys, err := c.ListAPIKeys(cmd.Context())
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(a.out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tNAME\tKEY\tCREATED\tSTATE")
			for _, k := range keys {
				state := "active"
				if !k.RevokedAt.IsZero() {
					state = "revoked " + k.RevokedAt.Local().Format(time.RFC3339)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", k.ID, k.Name, k.Mask, k.CreatedAt.Local().Format(time.RFC3339), state)
			}
			return tw.Flush()
		},
	}
	revoke := &cobra.Command{
		Use:   "revoke ID",
		Short: "Revoke an API key; requests with it get 401 from then on",
		Args:  exactArgs(1, "an API key ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			if err := c.RevokeAPIKey(cmd.Context(), args[0]); err != nil {
				return err
			}
			fmt.Fprintln(a.out, args[0])
			return nil
		},
	}
	cmd.AddCommand(create, ls, revoke)
	return cmd
}
