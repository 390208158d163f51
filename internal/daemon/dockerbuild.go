package daemon

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"net/url"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/agentlink"
	"github.com/berth-sandbox/berth/internal/audit"
	"github.com/berth-sandbox/berth/internal/dockerfile"
	"github.com/berth-sandbox/berth/internal/policy"
	"github.com/berth-sandbox/berth/internal/sandbox"
	"github.com/berth-sandbox/berth/internal/template"
)

// buildRunner runs a Dockerfile's RUN steps, each in a build sandbox of
// its own (dockerfile.Runner): a sandbox stacked on the layers so far,
// under the build network policy, whose writable layer is frozen into the
// step's layer once the command exits 0. The sandbox is destroyed after
// and its record removed with its logs, whether the step worked or not: a
// build's sandboxes are its own business, not entries for `berth ls` or
// E2B's Sandbox.list.
type buildRunner struct {
	mgr      *sandbox.Manager
	link     *agentlink.Link
	stateDir string
	network  policy.Policy
	// records removes an ended sandbox's record and logs.
	records interface {
		remove(ctx context.Context, id string) error
	}
}

// buildTemplate is the template whose settings (isolation) build
// sandboxes take; its layers are replaced by the build's.
const buildTemplate = "minimal"

// buildStepTimeout bounds one RUN.
const buildStepTimeout = time.Hour

func (b *buildRunner) Run(ctx context.Context, layers []string, c dockerfile.Command, log io.Writer, freeze func(ctx context.Context, upper string) error) error {
	p := b.network
	var id string
	sb, err := b.mgr.Create(ctx, sandbox.CreateRequest{
		Template: buildTemplate,
		Layers:   layers,
		Timeout:  buildStepTimeout,
		Network:  &p,
		Labels:   map[string]string{"berth.build": "dockerfile"},
		Setup: func(ctx context.Context, h *sandbox.SetupHandle) error {
			id = h.ID()
			addr, token := h.Agent()
			user := c.User
			if user == "" {
				user = "root"
			}
			if c.Cwd != "" && c.Cwd != "/" {
				// WORKDIR exists (the build made it), but a RUN may
				// have removed it: Docker makes it again, as root.
				if _, err := b.link.Run(ctx, addr, token, agentlink.Command{Argv: []string{"/bin/mkdir", "-p", "--", c.Cwd}, User: "root", Cwd: "/"}); err != nil {
					return err
				}
			}
			res, err := b.link.Run(ctx, addr, token, agentlink.Command{Argv: c.Argv, Env: c.Env, User: user, Cwd: c.Cwd, Stdout: log, Stderr: log})
			if err != nil {
				return err
			}
			if !res.Exited || res.ExitCode != 0 {
				return fmt.Errorf("the command ended with %s%s: %w", res.Status, b.denials(ctx, h.ID()), errdefs.ErrFailedPrecondition)
			}
			if !h.CanPause() {
				return fmt.Errorf("the build sandbox's runtime cannot pause to freeze its layer: %w", errdefs.ErrFailedPrecondition)
			}
			if err := h.Pause(ctx); err != nil {
				return err
			}
			ferr := freeze(ctx, filepath.Join(b.stateDir, h.ID(), "disk", "upper"))
			if err := h.Resume(context.WithoutCancel(ctx)); err != nil && ferr == nil {
				ferr = err
			}
			return ferr
		},
	})
	if sb.ID != "" {
		id = sb.ID
	}
	if id != "" {
		// A failed create has ended the sandbox already; a destroy
		// that fails leaves the record to say what was left.
		dctx := context.WithoutCancel(ctx)
		if err == nil {
			if derr := b.mgr.Destroy(dctx, id, "build step done"); derr != nil {
				return derr
			}
		}
		if rerr := b.records.remove(dctx, id); rerr != nil && err == nil {
			return fmt.Errorf("remove the record of build sandbox %s: %w", id, rerr)
		}
	}
	if err != nil {
		// The create's error carries the sandbox id; the step's own
		// cause is what a build log reader wants.
		return fmt.Errorf("RUN: %w", err)
	}
	return nil
}

// denials names what the build network refused the step, so a build
// that failed for want of the internet says which hosts it wanted.
func (b *buildRunner) denials(ctx context.Context, id string) string {
	recs, err := b.mgr.NetworkLog(ctx, id, audit.Filter{DeniedOnly: true})
	if err != nil || len(recs) == 0 {
		return ""
	}
	var dests []string
	for _, r := range recs {
		d := r.Name
		if d == "" {
			d = net.JoinHostPort(r.IP, strconv.Itoa(int(r.Port)))
		}
		if !slices.Contains(dests, d) {
			dests = append(dests, d)
		}
	}
	if len(dests) > 5 {
		dests = append(dests[:5], "...")
	}
	return fmt.Sprintf(" (the build network denied %s; build_network in the daemon's config says what builds may reach)", strings.Join(dests, ", "))
}

// buildNetwork is the egress policy of build sandboxes: the configured
// build_network, or by default only the registries and mirrors the daemon
// is configured with.
func buildNetwork(cfg Config) policy.Policy {
	if cfg.BuildNetwork != nil {
		return *cfg.BuildNetwork
	}
	var hosts []string
	add := func(h string) {
		if u, err := url.Parse(h); err == nil && u.Host != "" {
			h = u.Host
		}
		if host, _, err := net.SplitHostPort(h); err == nil {
			h = host
		}
		// A loopback registry is the daemon's to pull from: a sandbox
		// cannot reach the host's loopback, and the egress ceiling refuses
		// a policy naming it.
		if ip, err := netip.ParseAddr(h); (err == nil && ip.IsLoopback()) || h == "localhost" {
			return
		}
		if h != "" && !slices.Contains(hosts, h) {
			hosts = append(hosts, h)
		}
	}
	for _, m := range cfg.RegistryMirrors {
		add(m)
	}
	for _, r := range cfg.InsecureRegistries {
		add(r)
	}
	if len(hosts) == 0 {
		return policy.Policy{Mode: policy.ModeNone}
	}
	return policy.Policy{Mode: policy.ModeAllow, Allow: hosts}
}

// dockerBuilder runs Dockerfile builds for the API.
type dockerBuilder struct {
	store  *template.Store
	runner *buildRunner
}

func (d dockerBuilder) BuildDockerfile(ctx context.Context, req dockerfile.Request, log io.Writer) (template.Template, error) {
	return dockerfile.Build(ctx, d.store, d.runner, req, log)
}

// e2bTemplates runs E2B's template builds (e2bcompat.TemplateBuilder) with
// the Dockerfile builder.
type e2bTemplates struct{ dockerBuilder }

func (e e2bTemplates) BuildPlan(ctx context.Context, req dockerfile.Request, log io.Writer) (template.Template, error) {
	return dockerfile.Build(ctx, e.store, e.runner, req, log)
}

func (e e2bTemplates) Template(ctx context.Context, name string) (template.Template, error) {
	return e.store.Get(ctx, name)
}

// Copy makes dst a template of src's layers (shared, so nothing is
// copied but the manifest) and defaults.
func (e e2bTemplates) Copy(ctx context.Context, src, dst string) error {
	release := e.store.HoldLayers()
	defer release()
	layers, d, err := e.store.ImportLayers(ctx, src)
	if err != nil {
		return err
	}
	_, err = e.store.PutBuilt(ctx, template.BuildRecord{
		Name: dst, Description: "tag of " + src, Layers: layers, Defaults: d, Source: "tag of template " + src,
	})
	return err
}
