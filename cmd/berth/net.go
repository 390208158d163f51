package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.yaml.in/yaml/v3"

	"github.com/berth-sandbox/berth/client"
)

// policyFlags are the egress policy flags of `create` and `net set`.
type policyFlags struct {
	mode       string
	allow      []string
	deny       []string
	allowHTTP  []string
	policyFile string
}

func (p *policyFlags) register(f *pflag.FlagSet) {
	f.StringVar(&p.mode, "net", "", "egress mode: none (default), allow, open or learn")
	f.StringArrayVar(&p.allow, "allow", nil, "allow DOMAIN, *.DOMAIN or CIDR[:PORT] (repeatable; implies --net allow)")
	f.StringArrayVar(&p.deny, "deny", nil, "deny DOMAIN, *.DOMAIN or CIDR[:PORT] (repeatable; wins over allow)")
	f.StringArrayVar(&p.allowHTTP, "allow-http", nil, "allow 'HOST METHODS PATHPREFIX', e.g. 'api.example.com GET,HEAD /v1/' (repeatable)")
	f.StringVar(&p.policyFile, "net-policy", "", "egress policy file (YAML or JSON); - for stdin")
}

// build returns the policy the flags describe, or nil when none was given.
func (p *policyFlags) build(f *pflag.FlagSet, stdin func() ([]byte, error)) (*client.NetworkPolicy, error) {
	anyRule := len(p.allow)+len(p.deny)+len(p.allowHTTP) > 0
	if p.policyFile != "" {
		if anyRule || f.Changed("net") {
			return nil, invalidf("--net-policy cannot be combined with --net, --allow, --deny or --allow-http")
		}
		var data []byte
		var err error
		if p.policyFile == "-" {
			data, err = stdin()
		} else {
			data, err = os.ReadFile(p.policyFile)
		}
		if err != nil {
			return nil, invalidf("--net-policy: %v", err)
		}
		var pol client.NetworkPolicy
		dec := yaml.NewDecoder(strings.NewReader(string(data)))
		dec.KnownFields(true)
		if err := dec.Decode(&pol); err != nil {
			return nil, invalidf("--net-policy %s: %v", p.policyFile, err)
		}
		return &pol, nil
	}
	if !anyRule && !f.Changed("net") {
		return nil, nil
	}
	pol := &client.NetworkPolicy{Mode: p.mode, Allow: p.allow, Deny: p.deny}
	if pol.Mode == "" {
		pol.Mode = client.NetAllow
	}
	for _, s := range p.allowHTTP {
		fs := strings.Fields(s)
		if len(fs) != 3 {
			return nil, invalidf("--allow-http %q: want 'HOST METHODS PATHPREFIX'", s)
		}
		pol.HTTP = append(pol.HTTP, client.HTTPRule{Host: fs[0], Methods: strings.Split(fs[1], ","), Path: fs[2]})
	}
	return pol, nil
}

func newNetCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "net",
		Short: "Show and change a sandbox's egress policy, read its decision log",
	}
	cmd.AddCommand(newNetShowCmd(a), newNetSetCmd(a), newNetLogCmd(a), newNetSuggestCmd(a))
	return cmd
}

func printPolicy(a *app, p *client.NetworkPolicy, asJSON bool) error {
	if asJSON {
		enc := json.NewEncoder(a.out)
		enc.SetIndent("", "  ")
		return enc.Encode(p)
	}
	// YAML that --net-policy reads back.
	var b strings.Builder
	fmt.Fprintf(&b, "mode: %s\n", p.Mode)
	list := func(key string, xs []string) {
		if len(xs) == 0 {
			return
		}
		fmt.Fprintf(&b, "%s:\n", key)
		for _, x := range xs {
			fmt.Fprintf(&b, "  - %q\n", x)
		}
	}
	list("allow", p.Allow)
	list("deny", p.Deny)
	if len(p.HTTP) > 0 {
		b.WriteString("http:\n")
		for _, r := range p.HTTP {
			fmt.Fprintf(&b, "  - host: %q\n    methods: [%s]\n    path: %q\n", r.Host, strings.Join(r.Methods, ", "), r.Path)
		}
	}
	_, err := fmt.Fprint(a.out, b.String())
	return err
}

func newNetShowCmd(a *app) *cobra.Command {
	return newPolicyPrintCmd(a, "show ID", "Print a sandbox's egress policy (YAML, or --json)", (*client.Client).NetworkPolicy)
}

// newPolicyPrintCmd is a command that fetches one policy of a sandbox and
// prints it (show, suggest).
func newPolicyPrintCmd(a *app, use, short string, fetch func(*client.Client, context.Context, string) (*client.NetworkPolicy, error)) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Args:  exactArgs(1, "a sandbox ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			p, err := fetch(c, cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return printPolicy(a, p, asJSON)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func newNetSetCmd(a *app) *cobra.Command {
	var pf policyFlags
	cmd := &cobra.Command{
		Use:   "set ID",
		Short: "Replace a running sandbox's egress policy at once (a kill switch: open connections it refuses are closed)",
		Args:  exactArgs(1, "a sandbox ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := pf.build(cmd.Flags(), func() ([]byte, error) { return io.ReadAll(a.in) })
			if err != nil {
				return err
			}
			if p == nil {
				return invalidf("give --net, --allow, --deny, --allow-http or --net-policy")
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			out, err := c.SetNetworkPolicy(cmd.Context(), args[0], *p)
			if err != nil {
				return err
			}
			return printPolicy(a, out, false)
		},
	}
	pf.register(cmd.Flags())
	return cmd
}

func newNetLogCmd(a *app) *cobra.Command {
	var follow, denied, asJSON bool
	var since string
	cmd := &cobra.Command{
		Use:   "log ID",
		Short: "Print a sandbox's egress decisions",
		Args:  exactArgs(1, "a sandbox ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			print := func(r client.NetworkRecord) error {
				if asJSON {
					return json.NewEncoder(a.out).Encode(r)
				}
				dest := r.Name
				if r.IP != "" {
					dest = strings.TrimPrefix(dest+" "+r.IP, " ")
				}
				if r.Port != 0 {
					dest += fmt.Sprintf(":%d", r.Port)
				}
				req := ""
				if r.Method != "" {
					req = " " + r.Method + " " + r.Path
				}
				reason := ""
				if r.Reason != "" {
					reason = " (" + r.Reason + ")"
				}
				times := ""
				switch {
				case r.Count > 0 && !r.Last.IsZero():
					// One line for many decisions (aggregated or over
					// the audit rate limit).
					times = fmt.Sprintf("  x%d until %s", r.Count, r.Last.Local().Format(time.RFC3339))
				case r.Count > 1:
					times = fmt.Sprintf("  x%d", r.Count)
				}
				_, err := fmt.Fprintf(a.out, "%s  %-5s %-5s %s%s  [%s]%s  out=%d in=%d%s\n",
					r.Time.Local().Format(time.RFC3339), r.Decision, r.Proto, dest, req, r.Rule, reason, r.BytesOut, r.BytesIn, times)
				return err
			}
			f := client.NetworkLogFilter{Denied: denied}
			if since != "" {
				if f.Since, err = parseSince(since, time.Now()); err != nil {
					return err
				}
			}
			if follow {
				return c.FollowNetworkLogFiltered(cmd.Context(), args[0], f, print)
			}
			recs, err := c.NetworkLogFiltered(cmd.Context(), args[0], f)
			if err != nil {
				return err
			}
			for _, r := range recs {
				if err := print(r); err != nil {
					return err
				}
			}
			return nil
		},
	}
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing new decisions")
	cmd.Flags().BoolVar(&denied, "denied", false, "only denials")
	cmd.Flags().StringVar(&since, "since", "", "only decisions from this time on (RFC 3339, or a duration back from now such as 10m)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON record per line")
	return cmd
}

func newNetSuggestCmd(a *app) *cobra.Command {
	return newPolicyPrintCmd(a, "suggest ID", "Print the smallest allow policy covering what the sandbox was denied (feed it to net set --net-policy)", (*client.Client).SuggestNetworkPolicy)
}

// parseSince reads --since: an RFC 3339 time, or a duration back from now.
func parseSince(v string, now time.Time) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(v); err == nil && d >= 0 {
		return now.Add(-d), nil
	}
	return time.Time{}, invalidf("--since %q: want an RFC 3339 time or a duration such as 10m", v)
}
