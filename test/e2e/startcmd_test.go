package e2e

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/test/harness"
)

// Start commands and ready checks, end to end: templates from a loopback
// registry's image with each kind of check, a create that waits for it,
// and creates that fail clearly (a check that never passes, a start
// command that dies) without leaving anything behind.
func TestTemplateStartAndReady(t *testing.T) {
	reg := harness.StartRegistry(t)
	oci := harness.NewOCILayout(t)
	toolImage(t, oci, "svc")
	// The image's own command: only the start command when asked for.
	oci.Config("svc", "--clear=config.cmd", "--config.cmd=/bin/sh", "--config.cmd=-c",
		"--config.cmd=echo from-image > /tmp/from-image; exec sleep 100000")
	oci.Push("svc", reg, "team/svc:1")
	ref := reg.Addr + "/team/svc:1"
	d := StartDaemon(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	var live []string
	create := func(tpl string) *client.Sandbox {
		t.Helper()
		sb := d.Create(t, client.CreateRequest{Template: tpl})
		live = append(live, sb.ID)
		return sb
	}
	build := func(name string, args ...string) {
		t.Helper()
		out, errOut, code := d.CLI(t, nil, append([]string{"template", "build", name, "--image", ref}, args...)...)
		if code != 0 {
			t.Fatalf("template build %s %v = (%q, %q, %d)", name, args, out, errOut, code)
		}
	}

	// Port: the sandbox is ready once the server listens, so the first
	// request after create is answered.
	build("web", "--start-cmd", "mkdir -p /tmp/www && echo hello > /tmp/www/index.html && exec httpd -f -p 8080 -h /tmp/www", "--ready-port", "8080")
	sb := create("web")
	if got := MustRun(t, sb, "wget -qO- http://127.0.0.1:8080/index.html"); got != "hello\n" {
		t.Errorf("server after ready = %q", got)
	}
	// The start command runs as the template's user (USER 1000).
	if got := MustRun(t, sb, "ps -o user,args | grep '[h]ttpd' | awk '{print $1}'"); strings.TrimSpace(got) != "user" {
		t.Errorf("start command's user = %q, want user", got)
	}

	// File, with the image's CMD as the start command.
	build("fromimg", "--start-from-image", "--ready-file", "/tmp/from-image")
	sb = create("fromimg")
	if got := MustRun(t, sb, "cat /tmp/from-image"); got != "from-image\n" {
		t.Errorf("image command's file = %q", got)
	}

	// Command: ready once it exits 0.
	build("cmd", "--start-cmd", "i=0; while [ $i -lt 3 ]; do echo $i >> /tmp/count; i=$((i+1)); done; exec sleep 100000",
		"--ready-cmd", "test $(wc -l < /tmp/count) -eq 3")
	sb = create("cmd")
	if got := MustRun(t, sb, "wc -l < /tmp/count"); strings.TrimSpace(got) != "3" {
		t.Errorf("count after ready = %q", got)
	}
	tps, err := d.Client.Templates(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, tp := range tps {
		if tp.Name == "cmd" && (tp.Ready == nil || tp.Ready.Cmd == "" || len(tp.StartCmd) != 3 || tp.StartCmd[0] != "/bin/sh") {
			t.Errorf("template cmd = %+v (ready %+v)", tp, tp.Ready)
		}
	}

	// A check that never passes: the create fails with deadline_exceeded
	// naming the check, and leaves nothing behind.
	build("never", "--start-cmd", "exec sleep 100000", "--ready-file", "/never", "--ready-timeout", "2s")
	_, err = d.Client.Create(ctx, client.CreateRequest{Template: "never"})
	if !errors.Is(err, errdefs.ErrDeadlineExceeded) || !strings.Contains(err.Error(), "ready file /never") {
		t.Errorf("create with a check that never passes: %v, want deadline_exceeded naming ready file /never", err)
	}
	_, errOut, code := d.CLI(t, nil, "create", "--template", "never")
	if code == 0 || !strings.Contains(errOut, "ready file /never") {
		t.Errorf("CLI create with a check that never passes = (%q, %d)", errOut, code)
	}

	// A start command that dies before the check passes: failed at once,
	// with its output.
	build("dies", "--start-cmd", "echo cannot start; exit 3", "--ready-port", "9999")
	_, err = d.Client.Create(ctx, client.CreateRequest{Template: "dies"})
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "cannot start") || !strings.Contains(err.Error(), "ready port 9999") {
		t.Errorf("create whose start command dies: %v, want failed_precondition with its output", err)
	}

	// A rebuild without start flags keeps the start command and check.
	build("web")
	sb = create("web")
	if got := MustRun(t, sb, "wget -qO- http://127.0.0.1:8080/index.html"); got != "hello\n" {
		t.Errorf("server after rebuild = %q", got)
	}

	// Bad checks are refused naming the field.
	var apiErr *errdefs.Error
	_, err = d.Client.CreateTemplateFrom(ctx, client.TemplateCreateRequest{Name: "bad", Image: ref, Ready: &client.ReadyCheck{Port: 70000}}, nil)
	if !errors.As(err, &apiErr) || !errors.Is(err, errdefs.ErrInvalidArgument) || apiErr.Field != "ready" {
		t.Errorf("ready port 70000: %v, want invalid_argument on ready", err)
	}
	_, err = d.Client.CreateTemplateFrom(ctx, client.TemplateCreateRequest{Name: "bad", Image: ref, Ready: &client.ReadyCheck{Port: 80, File: "/x"}}, nil)
	if !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("two checks: %v, want invalid_argument", err)
	}
	if _, errOut, code := d.CLI(t, nil, "template", "build", "minimal", "--ready-port", "80"); code == 0 || !strings.Contains(errOut, "only with --image") {
		t.Errorf("--ready-port without --image = (%q, %d)", errOut, code)
	}
	// Only what the successful creates made is left; with them gone,
	// nothing is.
	for _, id := range live {
		if err := d.Client.Kill(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	AssertNoLeaks(t, d)
}
