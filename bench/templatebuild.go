package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/test/harness"
)

// benchDockerfile is the Dockerfile both builders build: an image from a
// loopback registry, a context copy, two RUN steps (many small files, then
// reading the copied ones), ENV, WORKDIR, USER and CMD. %s is the base
// image reference.
const benchDockerfile = `FROM %s
ENV GREETING=hello
WORKDIR /app
COPY src/ /app/src/
RUN mkdir -p out && i=0; while [ $i -lt 500 ]; do echo $i > out/f$i; i=$((i+1)); done
RUN cat src/* | wc -c > out/size && chown -R 1000:1000 /app
USER 1000
CMD ["/bin/sh", "-c", "exec sleep 100000"]
`

// runTemplateBuild measures template builds, n rounds: the same
// Dockerfile built by the daemon (each RUN in a build sandbox) and by
// Debian's buildah (`buildah bud`, chroot isolation, vfs storage: the
// setup that needs no extra kernel features), both without their step
// cache and again with it (nothing changed: every step a hit); then the
// time to interactive of a sandbox of the built template next to one of
// base. The base image comes from a registry on loopback; each builder
// pulls it once, before the rounds.
func runTemplateBuild(tb *runner, n int) error {
	buildah, err := exec.LookPath("buildah")
	if err != nil {
		return fmt.Errorf("buildah not found: the floor of the template build rows is Debian's buildah (apt-get install buildah)")
	}
	d, cleanup, err := startDaemon(tb)
	if err != nil {
		return err
	}
	defer cleanup()
	ctx := context.Background()

	reg := harness.StartRegistry(tb)
	oci := harness.NewOCILayout(tb)
	oci.New("bb")
	oci.AddLayer("bb", harness.BusyboxRoot(tb))
	oci.Push("bb", reg, "bench/bb:1")

	dir := tb.TempDir()
	ctxDir := filepath.Join(dir, "context")
	if err := os.MkdirAll(filepath.Join(ctxDir, "src"), 0o755); err != nil {
		return err
	}
	// 32 files of 64 KiB: the COPY step hashes and copies 2 MiB.
	for i := range 32 {
		f := filepath.Join(ctxDir, "src", fmt.Sprintf("f%02d", i))
		if err := os.WriteFile(f, bytes.Repeat([]byte{byte('a' + i%26)}, 64<<10), 0o644); err != nil {
			return err
		}
	}
	dockerfile := filepath.Join(ctxDir, "Dockerfile")
	if err := os.WriteFile(dockerfile, fmt.Appendf(nil, benchDockerfile, reg.Addr+"/bench/bb:1"), 0o644); err != nil {
		return err
	}

	store := filepath.Join(dir, "buildah")
	bah := func(args ...string) error {
		argv := append([]string{"--root", filepath.Join(store, "root"), "--runroot", filepath.Join(store, "run"), "--storage-driver", "vfs"}, args...)
		out, err := exec.Command(buildah, argv...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("buildah %v: %v\n%s", args, err, out)
		}
		return nil
	}
	tb.Cleanup(func() {
		// vfs layers are plain directories; rmi also lets go of buildah's
		// own lock and state files before the temp dir goes.
		_ = bah("rmi", "--all", "--force")
	})
	bud := func(noCache bool) error {
		args := []string{"bud", "--isolation", "chroot", "--layers", "--tls-verify=false", "--quiet", "-f", dockerfile, "-t", "bench:df"}
		if noCache {
			args = append(args, "--no-cache")
		}
		return bah(append(args, ctxDir)...)
	}
	build := func(noCache bool) error {
		_, err := d.Client.BuildDockerfile(ctx, "bench-df", client.DockerfileBuild{Dockerfile: dockerfile, ContextDir: ctxDir, NoCache: noCache}, nil)
		return err
	}
	// Each builder pulls the base image once, outside the rounds.
	if err := bah("pull", "--tls-verify=false", "--quiet", reg.Addr+"/bench/bb:1"); err != nil {
		return err
	}
	if err := build(false); err != nil {
		return fmt.Errorf("first build: %w", err)
	}

	var cold, bahCold, warm, bahWarm []time.Duration
	steps := []struct {
		what string
		run  func() error
		into *[]time.Duration
	}{
		{"build --no-cache", func() error { return build(true) }, &cold},
		{"buildah bud --no-cache", func() error { return bud(true) }, &bahCold},
		{"cached rebuild", func() error { return build(false) }, &warm},
		{"buildah bud, cached", func() error { return bud(false) }, &bahWarm},
	}
	for i := range n {
		for _, st := range steps {
			t0 := time.Now()
			if err := st.run(); err != nil {
				return fmt.Errorf("%s: %w", st.what, err)
			}
			*st.into = append(*st.into, time.Since(t0))
		}
		tb.Logf("template build round %d: berth %s (cached %s), buildah %s (cached %s)", i, cold[i], warm[i], bahCold[i], bahWarm[i])
	}
	// base is built once (from the cache dir's debootstrap tree), outside
	// the timing, as the latency rows do.
	if _, err := d.Client.BuildTemplate(ctx, "base", io.Discard); err != nil {
		return fmt.Errorf("build base: %w", err)
	}
	df, err := measureTTI(ctx, d, "bench-df", n, "")
	if err != nil {
		return err
	}
	base, err := measureTTI(ctx, d, "base", n, "")
	if err != nil {
		return err
	}
	line := func(what string, s []time.Duration) {
		fmt.Printf("| %s | %d | %s | %s |\n", what, len(s), fmtDur(pct(s, 50)), fmtDur(pct(s, 99)))
	}
	fmt.Printf("\n| template builds (one Dockerfile: FROM a loopback registry, COPY 2 MiB, 2 RUN) | n | p50 | p99 |\n|---|---|---|---|\n")
	line("berth: build, --no-cache (each RUN in a build sandbox)", cold)
	line("floor: `buildah bud --no-cache` (chroot isolation, vfs)", bahCold)
	line("berth: rebuild, nothing changed (every step CACHED)", warm)
	line("floor: `buildah bud --layers`, nothing changed", bahWarm)
	line("TTI, the built template (create → first byte of `echo ok`)", df)
	line("TTI, template base, same run", base)
	return nil
}
