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
)

// Dockerfile builds, end to end: every instruction on berth:minimal, RUN in
// build sandboxes of the real daemon, the context's .dockerignore, the step
// cache on a rebuild, --no-cache, and Dockerfiles that fail at a line.
func TestDockerfileBuild(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{
		"Dockerfile": `ARG BASE=berth:minimal
FROM ${BASE}
ARG GREETING=hello
ENV APP_HOME=/app MODE=test
WORKDIR $APP_HOME
COPY --chown=user:user src/ ./src/
ADD notes.txt /app/notes.txt
RUN echo "$GREETING from $MODE" > /app/greeting && cp /app/notes.txt /app/kept && rm /app/notes.txt
COPY . /ctx/
USER user
RUN id -un > /home/user/whoami
LABEL purpose=test
EXPOSE 8080
ENTRYPOINT ["/bin/sh", "-c"]
CMD ["echo started > /tmp/started; exec sleep 100000"]
`,
		".dockerignore": "secret.txt\n*.log\n",
		"src/main.sh":   "#!/bin/sh\necho main\n",
		"notes.txt":     "notes\n",
		"secret.txt":    "do not copy\n",
		"build.log":     "do not copy either\n",
	}
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(filepath.Join(dir, "src/main.sh"), 0o755); err != nil {
		t.Fatal(err)
	}
	d := StartDaemon(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	build := func(name string, args ...string) (string, string, int) {
		t.Helper()
		return d.CLI(t, nil, append([]string{"template", "build", name, "--dockerfile", filepath.Join(dir, "Dockerfile"), "--context", dir}, args...)...)
	}
	out, errOut, code := build("app", "--build-arg", "GREETING=hi", "--ready-file", "/tmp/started")
	if code != 0 || !strings.Contains(out, "app built") {
		t.Fatalf("dockerfile build = (%q, %q, %d)", out, errOut, code)
	}
	for _, want := range []string{"[line 2] FROM berth:minimal", "[line 8] RUN", "==> template app built"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("build log lacks %q:\n%s", want, errOut)
		}
	}
	if strings.Contains(errOut, "CACHED") {
		t.Errorf("first build had cache hits:\n%s", errOut)
	}

	sb := d.Create(t, client.CreateRequest{Template: "app"})
	got := MustRun(t, sb, `id -un; pwd; echo "$APP_HOME $MODE"; cat /app/greeting /app/kept /home/user/whoami /tmp/started; stat -c '%U %a' /app/src/main.sh; ls /app; ls -a /ctx`)
	want := "user\n/app\n/app test\nhi from test\nnotes\nuser\nstarted\nuser 755\ngreeting\nkept\nsrc\n.\n..\n.dockerignore\nDockerfile\nnotes.txt\nsrc\n"
	if got != want {
		t.Errorf("sandbox of the Dockerfile template:\n%s\nwant:\n%s", got, want)
	}
	ts, err := d.Client.Templates(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, tp := range ts {
		if tp.Name == "app" && (!strings.HasPrefix(tp.Source, "dockerfile Dockerfile from template minimal") || strings.Join(tp.StartCmd, " ") != "/bin/sh -c echo started > /tmp/started; exec sleep 100000") {
			t.Errorf("template app = %+v", tp)
		}
	}
	if err := d.Client.Kill(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}

	// The same build again: every layer step from the cache.
	_, errOut, code = build("app", "--build-arg", "GREETING=hi", "--ready-file", "/tmp/started")
	if code != 0 {
		t.Fatalf("rebuild: %s", errOut)
	}
	if n := strings.Count(errOut, "---> CACHED"); n != 6 || strings.Contains(errOut, "---> done") {
		t.Errorf("rebuild: %d cached steps, want 6:\n%s", n, errOut)
	}
	// Another build arg changes the RUN that reads it and what follows.
	_, errOut, code = build("app2")
	if code != 0 || strings.Count(errOut, "---> CACHED") != 3 {
		t.Errorf("build with the default GREETING: code %d, log:\n%s", code, errOut)
	}
	// --no-cache runs everything.
	_, errOut, code = build("app", "--no-cache", "--build-arg", "GREETING=hi")
	if code != 0 || strings.Contains(errOut, "CACHED") {
		t.Errorf("--no-cache: code %d, log:\n%s", code, errOut)
	}

	// A RUN that fails: the build fails naming its line, and leaves no
	// template and no sandbox.
	bad := filepath.Join(dir, "Dockerfile.bad")
	if err := os.WriteFile(bad, []byte("FROM berth:minimal\nENV A=1\nRUN echo failing; exit 7\nRUN echo never\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var log strings.Builder
	_, err = d.Client.BuildDockerfile(ctx, "bad", client.DockerfileBuild{Dockerfile: bad, ContextDir: dir}, &log)
	if err == nil || !strings.Contains(err.Error(), "line 3") || !strings.Contains(log.String(), "failing") || strings.Contains(log.String(), "never") {
		t.Errorf("failing RUN: %v\n%s", err, log.String())
	}
	// A bad instruction: invalid_argument naming the line, before any step.
	if err := os.WriteFile(bad, []byte("FROM berth:minimal\nRUN true\nCOPY --from=other /x /y\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, errOut, code = d.CLI(t, nil, "template", "build", "bad", "--dockerfile", bad, "--context", dir)
	if code == 0 || !strings.Contains(errOut, "line 3") || !strings.Contains(errOut, "invalid_argument") {
		t.Errorf("bad instruction = (%q, %d)", errOut, code)
	}
	// A COPY of something outside the context (or ignored) is refused.
	if err := os.WriteFile(bad, []byte("FROM berth:minimal\nCOPY secret.txt /x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = d.Client.BuildDockerfile(ctx, "bad", client.DockerfileBuild{Dockerfile: bad, ContextDir: dir}, nil)
	if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "line 2") {
		t.Errorf("COPY of an ignored file: %v", err)
	}
	if _, err := os.Stat(filepath.Join(d.DataDir, "templates", "bad", "manifest.json")); err == nil {
		t.Error("a failed build left a template")
	}
	live, err := d.Client.List(ctx, client.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, sb := range live {
		if sb.State != client.StateFailed && sb.State != client.StateStopped {
			t.Errorf("sandbox %s left %s", sb.ID, sb.State)
		}
		// The build sandboxes' records go with them, those of the
		// steps that worked and of the one that failed.
		if sb.Labels["berth.build"] != "" {
			t.Errorf("build sandbox %s left a %s record (%s)", sb.ID, sb.State, sb.Reason)
		}
	}
	if len(live) != 1 {
		t.Errorf("%d sandbox records after the builds, want only the one created from app", len(live))
	}
	AssertNoLeaks(t, d)
}

// A multi-stage Dockerfile: stages build FROM earlier ones and the last
// one COPY --from them (by name and by number); what a stage deleted stays
// deleted in what is copied from it (its layers are read merged).
func TestDockerfileMultiStage(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{
		"Dockerfile": `FROM berth:minimal AS build
WORKDIR /src
COPY src/ ./
RUN mkdir -p /out && cat a.txt b.txt > /out/joined && rm /src/b.txt
FROM build AS check
RUN test -f /out/joined && echo checked > /out/check
FROM berth:minimal
COPY --from=build /out/joined /app/joined
COPY --from=1 --chmod=0600 /out/check /app/
COPY --from=build /src/ /app/src/
`,
		"src/a.txt": "a\n",
		"src/b.txt": "b\n",
	}
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	d := StartDaemon(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var log strings.Builder
	if _, err := d.Client.BuildDockerfile(ctx, "multi", client.DockerfileBuild{Dockerfile: filepath.Join(dir, "Dockerfile"), ContextDir: dir}, &log); err != nil {
		t.Fatalf("multi-stage build: %v\n%s", err, log.String())
	}
	for _, want := range []string{"#1/10 [line 1] FROM berth:minimal", "#5/10 [line 5] FROM build", "#10/10 [line 10] COPY --from=build"} {
		if !strings.Contains(log.String(), want) {
			t.Errorf("build log lacks %q:\n%s", want, log.String())
		}
	}
	sb := d.Create(t, client.CreateRequest{Template: "multi"})
	got := MustRun(t, sb, "cat /app/joined /app/check; stat -c '%a' /app/check; ls /app/src; test -e /out || echo no-out; test -e /src || echo no-src")
	if want := "a\nb\nchecked\n600\na.txt\nno-out\nno-src\n"; got != want {
		t.Errorf("sandbox of the multi-stage template:\n%s\nwant:\n%s", got, want)
	}
	if err := d.Client.Kill(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	// A rebuild is all cache hits.
	log.Reset()
	if _, err := d.Client.BuildDockerfile(ctx, "multi", client.DockerfileBuild{Dockerfile: filepath.Join(dir, "Dockerfile"), ContextDir: dir}, &log); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(log.String(), "---> CACHED"); n != 7 || strings.Contains(log.String(), "---> done") {
		t.Errorf("rebuild: %d cached steps, want 7:\n%s", n, log.String())
	}
	AssertNoLeaks(t, d)
}
