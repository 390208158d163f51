package e2e

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/test/harness"
)

// Templates from OCI images, end to end: a real registry on loopback
// (Debian's docker-registry), images built by umoci and pushed by skopeo,
// the real daemon pulling them, and sandboxes running on the result.

// busyboxImage is an OCI layout holding image "bb": one layer with busybox
// and its applets, ready to push to a test registry.
func busyboxImage(t *testing.T) *harness.OCILayout {
	t.Helper()
	oci := harness.NewOCILayout(t)
	oci.New("bb")
	oci.AddLayer("bb", busyboxRoot(t))
	return oci
}

// busyboxRoot fills root with harness.BusyboxRoot's tree plus what the
// layer tests look for: /opt/gone (whited out later), /data/old (hidden
// by an opaque dir later) and /etc/arch.
func busyboxRoot(t *testing.T) func(root string) {
	base := harness.BusyboxRoot(t)
	return func(root string) {
		t.Helper()
		base(root)
		must := func(err error) {
			t.Helper()
			if err != nil {
				t.Fatal(err)
			}
		}
		for _, d := range []string{"opt/gone", "data"} {
			must(os.MkdirAll(filepath.Join(root, d), 0o755))
		}
		must(os.WriteFile(filepath.Join(root, "opt/gone/file"), []byte("deleted later\n"), 0o644))
		must(os.WriteFile(filepath.Join(root, "data/old"), []byte("hidden by an opaque dir\n"), 0o644))
		must(os.WriteFile(filepath.Join(root, "etc/arch"), []byte("amd64\n"), 0o644))
	}
}

// toolImage builds under tag: busybox base, a layer with a hard-linked
// file, a whiteout of /opt/gone, an opaque /data, and a config with ENV,
// WORKDIR, USER (numeric) and CMD.
func toolImage(t *testing.T, oci *harness.OCILayout, tag string) {
	oci.New(tag)
	oci.AddLayer(tag, busyboxRoot(t))
	oci.AddLayer(tag, func(root string) {
		dir := filepath.Join(root, "srv")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "a"), []byte("linked\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Link(filepath.Join(dir, "a"), filepath.Join(dir, "b")); err != nil {
			t.Fatal(err)
		}
	})
	oci.Whiteout(tag, "/opt/gone")
	oci.Opaque(tag, "/data", func(dir string) {
		if err := os.WriteFile(filepath.Join(dir, "new"), []byte("new\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	})
	oci.Config(tag, "--config.env=FOO=from-image", "--config.env=PATH=/opt/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"--config.workingdir=/work", "--config.user=1000", "--config.cmd=/bin/sh", "--config.cmd=-c", "--config.cmd=echo started")
}

func TestImageTemplate(t *testing.T) {
	reg := harness.StartRegistry(t)
	oci := harness.NewOCILayout(t)
	toolImage(t, oci, "tool")
	oci.Push("tool", reg, "team/tool:v1")
	// A second image on the same first layers plus one of its own.
	oci.Copy("tool", "tool2")
	oci.AddLayer("tool2", func(root string) {
		if err := os.WriteFile(filepath.Join(root, "extra"), []byte("x\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	})
	oci.Push("tool2", reg, "team/tool2:v1")

	d := StartDaemon(t)
	ref := reg.Addr + "/team/tool:v1"
	out, errOut, code := d.CLI(t, nil, "template", "build", "tool", "--image", ref)
	if code != 0 || !strings.Contains(out, "tool built") {
		t.Fatalf("template build --image = (%q, %q, %d)", out, errOut, code)
	}
	for _, want := range []string{"==> pulling " + ref, "layer 1/4", "layer 4/4", "==> template tool built"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("build log lacks %q:\n%s", want, errOut)
		}
	}

	sb := d.Create(t, client.CreateRequest{Template: "tool", Env: map[string]string{"FROM_REQUEST": "yes"}})
	// USER 1000 became the account name, WORKDIR the cwd, ENV the env
	// (PATH included), the request's env on top.
	got := MustRun(t, sb, `id -un; pwd; echo "$FOO $FROM_REQUEST $PATH"`)
	if want := "user\n/work\nfrom-image yes /opt/bin:/usr/sbin:/usr/bin:/sbin:/bin\n"; got != want {
		t.Errorf("defaults in the sandbox = %q, want %q", got, want)
	}
	// The whiteout removed /opt/gone, the opaque layer hid /data/old, the
	// hard link is one inode.
	got = MustRun(t, sb, `ls -a /opt; ls /data; stat -c %i /srv/a /srv/b | uniq | wc -l; cat /srv/b`)
	if want := ".\n..\nnew\n1\nlinked\n"; got != want {
		t.Errorf("layers in the sandbox = %q, want %q", got, want)
	}
	// Files are the sandbox's, not host root's: user owns /work.
	if got := MustRun(t, sb, `touch /work/x && stat -c %U /work/x`); got != "user\n" {
		t.Errorf("file made in /work owned by %q", got)
	}

	// The second image shares the first three layers: stored once.
	out, errOut, code = d.CLI(t, nil, "template", "build", "tool2", "--image", reg.Addr+"/team/tool2:v1")
	if code != 0 {
		t.Fatalf("build tool2 = (%q, %q, %d)", out, errOut, code)
	}
	if n := strings.Count(errOut, "already stored"); n != 4 {
		t.Errorf("tool2 build reused %d layers, want 4:\n%s", n, errOut)
	}
	layers, err := filepath.Glob(filepath.Join(d.DataDir, "templates/.layers/*.json"))
	if err != nil || len(layers) != 5 {
		t.Errorf("stored layers = %d (%v), want 5 for 4+1", len(layers), err)
	}
	ts, err := d.Client.Templates(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, tp := range ts {
		switch tp.Name {
		case "tool":
			if tp.Layers != 4 || tp.SharedLayers != 4 || !strings.HasPrefix(tp.Source, "image "+ref+"@sha256:") || tp.User != "user" || tp.Workdir != "/work" {
				t.Errorf("tool = %+v", tp)
			}
			if strings.Join(tp.Command, " ") != "/bin/sh -c echo started" {
				t.Errorf("tool command = %q", tp.Command)
			}
		case "tool2":
			if tp.Layers != 5 || tp.SharedLayers != 4 {
				t.Errorf("tool2 = %+v", tp)
			}
		}
	}
	out, _, _ = d.CLI(t, nil, "template", "ls")
	if !strings.Contains(out, "SHARED") || !strings.Contains(out, "image "+ref) {
		t.Errorf("template ls:\n%s", out)
	}

	// rm refuses while the sandbox runs; prune keeps what templates use.
	if _, errOut, code = d.CLI(t, nil, "template", "rm", "tool"); code == 0 || !strings.Contains(errOut, sb.ID) {
		t.Errorf("template rm while in use = (%q, %d), want a refusal naming %s", errOut, code, sb.ID)
	}
	if err := d.Client.Kill(context.Background(), sb.ID); err != nil {
		t.Fatal(err)
	}
	if out, errOut, code = d.CLI(t, nil, "template", "rm", "tool2"); code != 0 {
		t.Fatalf("template rm tool2 = (%q, %q, %d)", out, errOut, code)
	}
	out, errOut, code = d.CLI(t, nil, "template", "prune")
	if code != 0 || !strings.Contains(out, "removed 1 layer") {
		t.Errorf("template prune = (%q, %q, %d), want 1 layer removed", out, errOut, code)
	}
	// tool still works after the prune.
	sb2 := d.Create(t, client.CreateRequest{Template: "tool"})
	if got := MustRun(t, sb2, "cat /srv/a"); got != "linked\n" {
		t.Errorf("tool after prune: %q", got)
	}
}

func TestImageTemplateMirror(t *testing.T) {
	reg := harness.StartRegistry(t)
	oci := busyboxImage(t)
	oci.Push("bb", reg, "library/berthtest-busybox:1")

	cfg := filepath.Join(t.TempDir(), "berth.yaml")
	if err := os.WriteFile(cfg, []byte("registry_mirrors:\n  docker.io: http://"+reg.Addr+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	d := StartDaemon(t, "--config", cfg)
	// A Docker Hub name, served by the mirror: no network beyond loopback.
	var log strings.Builder
	tp, err := d.Client.CreateTemplate(context.Background(), "hub", "berthtest-busybox:1", &log)
	if err != nil {
		t.Fatalf("CreateTemplate via mirror: %v\n%s", err, log.String())
	}
	if !strings.Contains(log.String(), "from "+reg.Addr) || !strings.HasPrefix(tp.Source, "image index.docker.io/library/berthtest-busybox:1@") {
		t.Errorf("mirror pull: source %q, log:\n%s", tp.Source, log.String())
	}
	sb := d.Create(t, client.CreateRequest{Template: "hub"})
	if got := MustRun(t, sb, "cat /etc/arch"); got != "amd64\n" {
		t.Errorf("sandbox from mirrored image: %q", got)
	}
}

func TestImageTemplateManifestList(t *testing.T) {
	reg := harness.StartRegistry(t)
	oci := harness.NewOCILayout(t)
	oci.New("amd")
	oci.AddLayer("amd", busyboxRoot(t))
	oci.Config("amd", "--os=linux", "--architecture=amd64")
	oci.New("arm")
	oci.AddLayer("arm", func(root string) {
		if err := os.MkdirAll(filepath.Join(root, "etc"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, "etc/arch"), []byte("arm64\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	})
	oci.Config("arm", "--os=linux", "--architecture=arm64")
	oci.Index("multi", "arm", "amd") // arm64 first: picking the first would be wrong
	oci.Push("multi", reg, "team/multi:latest")

	d := StartDaemon(t)
	var log strings.Builder
	if _, err := d.Client.CreateTemplate(context.Background(), "multi", reg.Addr+"/team/multi:latest", &log); err != nil {
		t.Fatalf("CreateTemplate(manifest list): %v\n%s", err, log.String())
	}
	sb := d.Create(t, client.CreateRequest{Template: "multi"})
	if got := MustRun(t, sb, "cat /etc/arch"); got != "amd64\n" {
		t.Errorf("manifest list gave the %q image, want amd64", got)
	}
}

func TestImageTemplateErrors(t *testing.T) {
	reg := harness.StartRegistry(t)
	oci := busyboxImage(t)
	oci.Push("bb", reg, "team/bb:1")
	d := StartDaemon(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	var apiErr *errdefs.Error
	// A malformed reference: invalid_argument naming image.
	_, err := d.Client.CreateTemplate(ctx, "bad", "UPPER/Case::x", nil)
	if !errors.As(err, &apiErr) || !errors.Is(err, errdefs.ErrInvalidArgument) || apiErr.Field != "image" {
		t.Errorf("bad ref: %v, want invalid_argument on field image", err)
	}
	// An image the registry does not have: not_found.
	if _, err := d.Client.CreateTemplate(ctx, "nf", reg.Addr+"/team/nope:1", nil); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("unknown image: %v, want not_found", err)
	}
	if _, err := d.Client.CreateTemplate(ctx, "nf", reg.Addr+"/team/bb:2", nil); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("unknown tag: %v, want not_found", err)
	}
	// The registry down: unavailable, naming it; the CLI exits non-zero.
	reg.Stop()
	_, err = d.Client.CreateTemplate(ctx, "down", reg.Addr+"/team/bb:1", nil)
	if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), reg.Addr) {
		t.Errorf("registry down: %v, want unavailable naming %s", err, reg.Addr)
	}
	_, errOut, code := d.CLI(t, nil, "template", "build", "down", "--image", reg.Addr+"/team/bb:1")
	if code == 0 || !strings.Contains(errOut, "unavailable") || !strings.Contains(errOut, reg.Addr) {
		t.Errorf("CLI with the registry down = (%q, %d)", errOut, code)
	}
	// Nothing was left behind: no template, no layer, no partial pull.
	entries, _ := os.ReadDir(filepath.Join(d.DataDir, "templates/.layers"))
	for _, e := range entries {
		t.Errorf("left in the layer store: %s", e.Name())
	}
	for _, name := range []string{"bad", "nf", "down"} {
		if _, err := os.Stat(filepath.Join(d.DataDir, "templates", name)); err == nil {
			t.Errorf("template dir %s left behind", name)
		}
	}
	// Back up, the same build works and a built-in name is refused.
	reg.Start()
	if _, err := d.Client.CreateTemplate(ctx, "down", reg.Addr+"/team/bb:1", nil); err != nil {
		t.Errorf("after the registry is back: %v", err)
	}
	if _, err := d.Client.CreateTemplate(ctx, "minimal", reg.Addr+"/team/bb:1", nil); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("image over built-in minimal: %v, want invalid_argument", err)
	}
}
