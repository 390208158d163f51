// Package arch guards the shape of the code base: the import graph the
// architecture promises and a doc comment on every package.
package arch

import (
	"encoding/json"
	"io"
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/berth-sandbox/berth"

type pkg struct {
	ImportPath string
	Doc        string
	Deps       []string
	Name       string
	GoFiles    []string
}

func listPackages(t *testing.T) []pkg {
	t.Helper()
	cmd := exec.Command("go", "list", "-json", "-deps=false", module+"/...")
	cmd.Dir = "../.."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	var pkgs []pkg
	for {
		var p pkg
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

func TestEveryPackageDocumented(t *testing.T) {
	for _, p := range listPackages(t) {
		if p.Doc == "" && len(p.GoFiles) > 0 {
			t.Errorf("package %s has no doc comment (// Package %s …)", p.ImportPath, p.Name)
		}
	}
}

// Third-party packages that carry a backend: the database and host
// networking; and the Berth packages that hold backends or HTTP.
const (
	sqlite    = "modernc.org/sqlite"
	nftables  = "github.com/google/nftables"
	netlink   = "github.com/vishvananda/netlink"
	runcPkg   = module + "/internal/runtime/runc"
	storePkg  = module + "/internal/store"
	apiPkg    = module + "/internal/api"
	sandboxes = module + "/internal/sandbox"
)

func TestImportGraph(t *testing.T) {
	rules := []struct {
		pkg       string
		forbidden []string
		allowed   []string
	}{
		// The agent lives inside untrusted sandboxes: nothing host-side.
		{"cmd/berth-agent", []string{module + "/internal/", module + "/client", "k8s.io/", "github.com/virtual-kubelet/"}, []string{module + "/internal/agent", module + "/internal/meminfo", module + "/internal/crilog", module + "/proto/"}},
		// The Manager owns no concrete backend and speaks no HTTP: its
		// records and Store interface are internal/core's, and the SQLite
		// store implements them.
		// Workspaces, review, the work log and E2B compatibility sit above
		// it and use it; it never imports them.
		{"internal/sandbox", []string{runcPkg, "net/http", apiPkg, storePkg, sqlite, nftables, netlink,
			module + "/internal/workspace", module + "/internal/review", module + "/internal/worklog", module + "/internal/e2bcompat", module + "/internal/secret"}, nil},
		// The agent links meminfo, so it stays a leaf.
		{"internal/meminfo", []string{module + "/"}, []string{module + "/internal/meminfo"}},
		// So does the log format it shares with the Kubernetes node.
		{"internal/crilog", []string{module + "/"}, []string{module + "/internal/crilog"}},
		// The core's records import nothing of Berth's.
		{"internal/core", []string{module + "/"}, []string{module + "/internal/core"}},
		// The quota check the Manager and the gateway share needs only the
		// records, the error classes and the units.
		{"internal/quota", []string{module + "/"}, []string{module + "/internal/quota", module + "/internal/core", module + "/errdefs", module + "/internal/units"}},
		// The layers beside the Manager use it, not its backends.
		{"internal/workspace", []string{runcPkg, storePkg, sqlite, nftables, netlink, apiPkg}, nil},
		{"internal/e2bcompat", []string{runcPkg, storePkg, sqlite, nftables, netlink, apiPkg}, nil},
		{"internal/worklog", []string{sandboxes, module + "/internal/runtime", storePkg, sqlite, nftables, netlink, apiPkg}, nil},
		{"internal/review", []string{sandboxes, module + "/internal/runtime", storePkg, sqlite, nftables, netlink, apiPkg}, nil},
		// The SDK is public: nothing under internal/, and none of
		// Kubernetes' client libraries (the node pulls them in).
		{"client", []string{module + "/internal/", "k8s.io/", "github.com/virtual-kubelet/"}, nil},
		// A Kubernetes node reaches the daemon through its API (the
		// Sandboxes interface over the SDK), never its internals.
		{"internal/kube/node", []string{sandboxes, module + "/internal/daemon", module + "/internal/runtime", storePkg, sqlite, nftables, netlink, apiPkg,
			module + "/internal/hostnet", module + "/internal/egress", module + "/internal/template"}, nil},
		// The gateway holds no state and runs no sandbox: it links none
		// of the daemon's machinery, SQLite included.
		{"internal/kube/gateway", []string{sandboxes, module + "/internal/daemon", module + "/internal/runtime", storePkg, sqlite, nftables, netlink, apiPkg,
			module + "/internal/hostnet", module + "/internal/egress", module + "/internal/template", module + "/internal/e2bcompat"}, nil},
		// E2B's wire shapes are shared by the daemon's E2B API and the
		// gateway's: no sandbox backend, no Kubernetes.
		{"internal/e2bwire", []string{sandboxes, module + "/internal/daemon", module + "/internal/runtime", storePkg, sqlite, nftables, netlink, apiPkg,
			module + "/internal/e2bcompat", module + "/internal/kube", "k8s.io/"}, nil},
		// The wire contract is a leaf both the daemon and the SDK import.
		{"api/types", []string{module + "/"}, []string{module + "/api/types", module + "/errdefs"}},
		// The agent protocol's constants are a leaf the agent may import
		// (it may import proto/) as well as the daemon.
		{"proto/envd", []string{module + "/"}, []string{module + "/proto/envd"}},
		// So is the UDP tunnels' framing, which the SDK and the daemon share.
		{"proto/datagram", []string{module + "/"}, []string{module + "/proto/datagram"}},
		// Lower layers never call each other or upward.
		{"internal/runtime/runc", []string{module + "/internal/sandbox", module + "/internal/hostnet", module + "/internal/egress", module + "/internal/template", module + "/internal/store", module + "/internal/api"}, nil},
		// The policy language is pure: no host networking, no kernel.
		{"internal/policy", []string{module + "/internal/hostnet", module + "/internal/egress", module + "/internal/sandbox", module + "/internal/runtime", module + "/internal/template", module + "/internal/store", module + "/internal/api",
			"github.com/google/nftables", "github.com/vishvananda/netlink", "github.com/mdlayher/netlink", "golang.org/x/sys/unix"}, nil},
		{"internal/hostnet", []string{module + "/internal/egress", module + "/internal/sandbox", module + "/internal/runtime", module + "/internal/template", module + "/internal/store", module + "/internal/api"}, nil},
		{"internal/egress", []string{module + "/internal/hostnet", module + "/internal/sandbox", module + "/internal/runtime", module + "/internal/template", module + "/internal/store", module + "/internal/api"}, nil},
		// The template store (which the Manager imports) speaks no HTTP:
		// registries are internal/imagepull's, behind template.Puller.
		{"internal/template", []string{"net/http", module + "/internal/imagepull", module + "/internal/sandbox", module + "/internal/runtime", module + "/internal/hostnet", module + "/internal/egress", module + "/internal/store", module + "/internal/api"}, nil},
		{"internal/imagepull", []string{module + "/internal/sandbox", module + "/internal/runtime", module + "/internal/hostnet", module + "/internal/egress", module + "/internal/store", module + "/internal/api", module + "/internal/daemon"}, nil},
		{"internal/store", []string{module + "/internal/sandbox", module + "/internal/runtime", module + "/internal/hostnet", module + "/internal/egress", module + "/internal/template", module + "/internal/api"}, nil},
	}
	for _, r := range rules {
		cmd := exec.Command("go", "list", "-deps", module+"/"+r.pkg)
		cmd.Dir = "../.."
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", r.pkg, err)
		}
	next:
		for _, dep := range strings.Fields(string(out)) {
			for _, a := range r.allowed {
				if dep == a || strings.HasPrefix(dep, a) {
					continue next
				}
			}
			for _, f := range r.forbidden {
				if dep == f || (strings.HasSuffix(f, "/") && strings.HasPrefix(dep, f)) || strings.HasPrefix(dep, f+"/") {
					t.Errorf("%s links %s", r.pkg, dep)
				}
			}
		}
	}
}
