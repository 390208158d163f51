package e2e

import (
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/test/harness"
)

// TestTemplateExportImport: an image template exported by one daemon is
// made on another (its own data dir and uid range) from the archive alone,
// with the registry down: a sandbox there sees the image's files, layers
// and defaults, owned by its own users. A second import under a new name
// shares the layers; the name taken (unless --replace, never a built-in
// one), a built-in template's export and a tampered archive are refused,
// the last leaving nothing behind.
func TestTemplateExportImport(t *testing.T) {
	reg := harness.StartRegistry(t)
	oci := harness.NewOCILayout(t)
	toolImage(t, oci, "tool")
	oci.Push("tool", reg, "team/tool:v1")
	ref := reg.Addr + "/team/tool:v1"

	d1 := StartDaemon(t)
	d2 := StartDaemon(t)
	ctx := t.Context()
	if out, errOut, code := d1.CLI(t, nil, "template", "build", "tool", "--image", ref, "--ready-file", "/srv/a"); code != 0 {
		t.Fatalf("template build: %d %s %s", code, out, errOut)
	}
	if _, err := d1.Client.SetTemplateIsolation(ctx, "tool", "runc"); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "tool.tar")
	if out, errOut, code := d1.CLI(t, nil, "template", "export", "tool", "-o", file); code != 0 || !strings.Contains(out, file) {
		t.Fatalf("template export: %d %s %s", code, out, errOut)
	}
	reg.Stop()

	out, errOut, code := d2.CLI(t, nil, "template", "import", file)
	if code != 0 || !strings.HasPrefix(out, "tool: ") {
		t.Fatalf("template import: %d %q %s", code, out, errOut)
	}
	ts1, err := d1.Client.Templates(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ts2, err := d2.Client.Templates(ctx)
	if err != nil {
		t.Fatal(err)
	}
	find := func(ts []client.Template, name string) client.Template {
		i := slices.IndexFunc(ts, func(tp client.Template) bool { return tp.Name == name })
		if i < 0 {
			t.Fatalf("no template %s in %+v", name, ts)
		}
		return ts[i]
	}
	a, b := find(ts1, "tool"), find(ts2, "tool")
	if !b.Built || b.Source != a.Source || b.Layers != a.Layers || b.SizeBytes != a.SizeBytes || b.User != a.User ||
		b.Workdir != a.Workdir || !slices.Equal(b.Env, a.Env) || !slices.Equal(b.Command, a.Command) ||
		b.Isolation != "runc" || b.Ready == nil || b.Ready.File != "/srv/a" || !b.BuiltAt.Equal(a.BuiltAt) {
		t.Errorf("imported template = %+v\nexported one      = %+v", b, a)
	}

	sb := d2.Create(t, client.CreateRequest{Template: "tool"})
	got := MustRun(t, sb, `id -un; pwd; echo "$FOO"; ls -a /opt; ls /data; stat -c %i /srv/a /srv/b | uniq | wc -l; cat /srv/b; touch /work/x && stat -c %U /work/x`)
	if want := "user\n/work\nfrom-image\n.\n..\nnew\n1\nlinked\nuser\n"; got != want {
		t.Errorf("the imported template in a sandbox = %q, want %q", got, want)
	}

	// Under a new name the layers are shared; the name taken is refused.
	if _, _, code := d2.CLI(t, nil, "template", "import", file, "--name", "tool-copy"); code != 0 {
		t.Fatalf("import --name tool-copy: exit %d", code)
	}
	if layers, _ := filepath.Glob(filepath.Join(d2.DataDir, "templates/.layers/*.json")); len(layers) != a.Layers {
		t.Errorf("%d layers stored after two imports, want %d (shared)", len(layers), a.Layers)
	}
	if _, errOut, code := d2.CLI(t, nil, "template", "import", file); code == 0 || !strings.Contains(errOut, "already_exists") {
		t.Errorf("import over tool: exit %d %q; want already_exists", code, errOut)
	}
	// --replace takes its place (the same archive here); never a
	// built-in's; a bad replace value is refused naming it.
	if out, errOut, code := d2.CLI(t, nil, "template", "import", file, "--replace"); code != 0 || !strings.Contains(out, "tool:") {
		t.Errorf("import --replace over tool: exit %d %q %q", code, out, errOut)
	}
	if _, errOut, code := d2.CLI(t, nil, "template", "import", file, "--name", "minimal", "--replace"); code == 0 || !strings.Contains(errOut, "already_exists") {
		t.Errorf("import --replace over built-in minimal: exit %d %q; want already_exists", code, errOut)
	}
	if resp, err := http.Post(d2.URL+"/v1/templates/import?replace=maybe", "application/x-tar", strings.NewReader("")); err != nil {
		t.Error(err)
	} else {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), `"replace"`) {
			t.Errorf("replace=maybe: %d %s; want 400 naming replace", resp.StatusCode, b)
		}
	}
	if _, errOut, code := d1.CLI(t, nil, "template", "export", "minimal", "-o", filepath.Join(t.TempDir(), "m.tar")); code == 0 || !strings.Contains(errOut, "failed_precondition") {
		t.Errorf("export of built-in minimal: exit %d %q; want failed_precondition", code, errOut)
	}

	// A flipped byte: refused on its digest, nothing left on a third
	// daemon.
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	i := strings.LastIndex(string(data), "linked")
	if i < 0 {
		t.Fatal("archive does not hold /srv/a's content")
	}
	data[i] = 'L'
	bad := filepath.Join(t.TempDir(), "bad.tar")
	if err := os.WriteFile(bad, data, 0o600); err != nil {
		t.Fatal(err)
	}
	d3 := StartDaemon(t)
	if _, errOut, code := d3.CLI(t, nil, "template", "import", bad); code == 0 || !strings.Contains(errOut, "digest") || !strings.Contains(errOut, "invalid_argument") {
		t.Errorf("import of a tampered archive: exit %d %q; want invalid_argument on a digest", code, errOut)
	}
	if left, _ := os.ReadDir(filepath.Join(d3.DataDir, "templates/.layers")); len(left) != 0 {
		t.Errorf("a refused import left %d entries in the layer store", len(left))
	}
	if _, err := os.Stat(filepath.Join(d3.DataDir, "templates/tool")); err == nil {
		t.Error("a refused import left templates/tool")
	}
	if err := d2.Client.Kill(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	AssertNoLeaks(t, d2)
}
