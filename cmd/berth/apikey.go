package main

import (
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/berth-sandbox/berth/client"
)

// quotaFlags are the quota flags of apikey create and update.
type quotaFlags struct {
	maxSandboxes int64
	maxCPU       float64
	maxMemory    string
	maxTimeout   string
	maxVolumes   string
}

func (q *quotaFlags) add(cmd *cobra.Command) {
	f := cmd.Flags()
	f.Int64Var(&q.maxSandboxes, "max-sandboxes", 0, "most live sandboxes the key may hold at once, paused ones included (0: unbounded)")
	f.Float64Var(&q.maxCPU, "max-cpu", 0, "most CPU cores its running sandboxes may ask for together, paused ones not counted (0: unbounded)")
	f.StringVar(&q.maxMemory, "max-memory", "", "most memory its running sandboxes may ask for together, paused ones not counted, e.g. 8G (0: unbounded)")
	f.StringVar(&q.maxTimeout, "max-timeout", "", "longest lifetime one of its sandboxes may ask for, e.g. 2h (0: unbounded)")
	f.StringVar(&q.maxVolumes, "max-volume-size", "", "most its volumes may hold together (their sizes), e.g. 100G (0: unbounded)")
}

// update is the request that sets the flags the user gave.
func (q *quotaFlags) update(cmd *cobra.Command) client.UpdateAPIKeyRequest {
	var u client.UpdateAPIKeyRequest
	f := cmd.Flags()
	if f.Changed("max-sandboxes") {
		u.MaxSandboxes = &q.maxSandboxes
	}
	if f.Changed("max-cpu") {
		u.MaxCPU = &q.maxCPU
	}
	if f.Changed("max-memory") {
		u.MaxMemory = &q.maxMemory
	}
	if f.Changed("max-timeout") {
		u.MaxTimeout = &q.maxTimeout
	}
	if f.Changed("max-volume-size") {
		u.MaxVolumeSize = &q.maxVolumes
	}
	return u
}

// quotaString renders a quota for listings.
func quotaString(q *client.Quota) string {
	if q == nil {
		return "-"
	}
	var parts []string
	if q.MaxSandboxes > 0 {
		parts = append(parts, "sandboxes="+strconv.FormatInt(q.MaxSandboxes, 10))
	}
	if q.MaxCPU > 0 {
		parts = append(parts, "cpu="+strconv.FormatFloat(q.MaxCPU, 'g', -1, 64))
	}
	if q.MaxMemory != "" {
		parts = append(parts, "memory="+q.MaxMemory)
	}
	if q.MaxTimeout != "" {
		parts = append(parts, "timeout="+q.MaxTimeout)
	}
	if q.MaxVolumeSize != "" {
		parts = append(parts, "volumes="+q.MaxVolumeSize)
	}
	return strings.Join(parts, ",")
}

// newAPIKeyCmd manages API keys, which authenticate the native and the
// E2B-compatible API.
func newAPIKeyCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "apikey",
		Short: "Manage API keys (BERTH_API_KEY for the native API, E2B_API_KEY for E2B's)",
		Args:  cobra.NoArgs,
	}
	var (
		name  string
		admin bool
		cq    quotaFlags
	)
	create := &cobra.Command{
		Use:   "create [--name NAME] [--admin] [--max-sandboxes K] [--max-cpu C] [--max-memory M] [--max-timeout D] [--max-volume-size S]",
		Short: "Create an API key and print it (it is shown only once)",
		Long: `Create an API key and print it (it is shown only once). A key sees and
touches only the sandboxes it creates, on both APIs; an --admin key sees
all and manages keys. Quotas bound what the key's live sandboxes hold at
once; a create past one fails with resource_exhausted.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			req := client.CreateAPIKeyRequest{Name: name, Admin: admin}
			u := cq.update(cmd)
			if u != (client.UpdateAPIKeyRequest{}) {
				req.Quota = &client.Quota{MaxSandboxes: cq.maxSandboxes, MaxCPU: cq.maxCPU, MaxMemory: cq.maxMemory, MaxTimeout: cq.maxTimeout, MaxVolumeSize: cq.maxVolumes}
			}
			k, err := c.CreateAPIKeyWith(cmd.Context(), req)
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
	create.Flags().BoolVar(&admin, "admin", false, "the key sees and manages every sandbox and key")
	cq.add(create)
	var uq quotaFlags
	update := &cobra.Command{
		Use:   "update ID [--max-sandboxes K] [--max-cpu C] [--max-memory M] [--max-timeout D] [--max-volume-size S]",
		Short: "Change a key's quota (0 removes a bound; flags not given stay)",
		Args:  exactArgs(1, "an API key ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			u := uq.update(cmd)
			if u == (client.UpdateAPIKeyRequest{}) {
				return invalidf("give at least one of --max-sandboxes, --max-cpu, --max-memory, --max-timeout, --max-volume-size")
			}
			k, err := c.UpdateAPIKey(cmd.Context(), args[0], u)
			if err != nil {
				return err
			}
			fmt.Fprintf(a.out, "%s\t%s\n", k.ID, quotaString(k.Quota))
			return nil
		},
	}
	uq.add(update)
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
			fmt.Fprintln(tw, "ID\tNAME\tKEY\tCREATED\tROLE\tQUOTA\tSTATE")
			for _, k := range keys {
				state := "active"
				if !k.RevokedAt.IsZero() {
					state = "revoked " + k.RevokedAt.Local().Format(time.RFC3339)
				}
				role := "user"
				if k.Admin {
					role = "admin"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", k.ID, k.Name, k.Mask, k.CreatedAt.Local().Format(time.RFC3339), role, quotaString(k.Quota), state)
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
	cmd.AddCommand(create, update, ls, revoke)
	return cmd
}
