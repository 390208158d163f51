package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// rawPause is the floor of a gVisor pause and resume: `runsc checkpoint`
// and `runsc restore` run by hand, without the daemon, of a busybox
// sandbox whose process holds mib MiB, n rounds. No network (the floor is
// the sandbox, not its network), no cgroup limits, no idmapped layers.
// Each round is taken with --direct (the image's pages with O_DIRECT)
// where the daemon uses it, then through the page cache, one after the
// other: the sandbox's first save, which gVisor makes slower (it reads
// every page it has not saved or loaded before, to skip the zero ones),
// is then the first --direct one, as a daemon's first pause is.
type rawPause struct {
	checkpoints, restores             []time.Duration
	directCheckpoints, directRestores []time.Duration
}

// measureRawPause takes the rawPause rows on platform (the daemon's choice,
// so both sides run alike), the --direct ones too if direct.
func measureRawPause(ctx context.Context, platform string, mib, n int, direct bool) (*rawPause, error) {
	dir, err := os.MkdirTemp("", "berth-bench-rawpause-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, err
	}
	rootfs := filepath.Join(dir, "rootfs")
	if err := busyboxRootfs(rootfs, 1_000_000); err != nil {
		return nil, err
	}
	b, err := os.ReadFile(memholdBin)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(rootfs, "bin", "memhold"), b, 0o755); err != nil {
		return nil, err
	}
	spec := rawSpec(rootfs)
	spec.Linux.Namespaces = slicesDeleteNet(spec.Linux.Namespaces)
	// The same holder as the daemon's rows (memhold), which says when
	// its memory is held by a file in /dev (a tmpfs).
	spec.Process.Args = []string{"/bin/memhold", "-mib", strconv.Itoa(mib), "-ready", "/dev/held"}
	b, err = json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), b, 0o600); err != nil {
		return nil, err
	}
	root := filepath.Join(dir, "state")
	id := fmt.Sprintf("berth-bench-rawpause-%d", os.Getpid())
	// Output goes to a file: a detached sandbox inherits runsc's stdio,
	// and a pipe would keep cmd.Run waiting for the holder to end.
	logPath := filepath.Join(dir, "runsc.out")
	runsc := func(args ...string) error {
		out, err := os.Create(logPath)
		if err != nil {
			return err
		}
		defer out.Close()
		cmd := exec.CommandContext(ctx, "runsc", append([]string{"--root", root, "--network=none", "--platform=" + platform}, args...)...)
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Run(); err != nil {
			b, _ := os.ReadFile(logPath)
			return fmt.Errorf("runsc %s: %w: %s", strings.Join(args, " "), err, b)
		}
		return nil
	}
	defer func() { _ = runsc("delete", "--force", id) }()
	if err := runsc("run", "--detach", "--bundle", dir, id); err != nil {
		return nil, err
	}
	// A bench, not a test: the holder is polled until it says it is built.
	deadline := time.Now().Add(60 * time.Second)
	for runsc("exec", id, "/bin/cat", "/dev/held") != nil {
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("raw runsc holder of %d MiB not built after 60s", mib)
		}
		time.Sleep(50 * time.Millisecond)
	}
	out := &rawPause{}
	round := func(img string, flags []string, checkpoints, restores *[]time.Duration) error {
		t0 := time.Now()
		if err := runsc(append(append([]string{"checkpoint"}, flags...), "--image-path", img, id)...); err != nil {
			return err
		}
		*checkpoints = append(*checkpoints, time.Since(t0))
		// The checkpointed container is gone from runsc's view once
		// deleted; the restore makes it again from the bundle.
		if err := runsc("delete", "--force", id); err != nil {
			return err
		}
		t0 = time.Now()
		if err := runsc(append(append([]string{"restore", "--detach"}, flags...), "--bundle", dir, "--image-path", img, id)...); err != nil {
			return err
		}
		*restores = append(*restores, time.Since(t0))
		// The holder came back with its memory: the file it wrote is
		// still in its /dev.
		if err := runsc("exec", id, "/bin/cat", "/dev/held"); err != nil {
			return fmt.Errorf("after restore: %w", err)
		}
		return os.RemoveAll(img)
	}
	for i := range n {
		if direct {
			if err := round(filepath.Join(dir, fmt.Sprintf("image-direct-%d", i)), []string{"--direct"}, &out.directCheckpoints, &out.directRestores); err != nil {
				return nil, err
			}
		}
		if err := round(filepath.Join(dir, fmt.Sprintf("image-%d", i)), nil, &out.checkpoints, &out.restores); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// daemonPlatform is the gVisor platform the daemon chose, from its log
// line "gvisor runtime … platform=P" ("" when it logged none).
func daemonPlatform(logs string) string {
	return gvisorRuntimeField(logs, "platform")
}

// daemonDirect says the daemon checkpoints and restores with --direct where
// the image's file system takes it (its log line "gvisor runtime …
// direct_image_io=true").
func daemonDirect(logs string) bool {
	return gvisorRuntimeField(logs, "direct_image_io") == "true"
}

// gvisorRuntimeField is the value of key in the daemon's "gvisor runtime"
// log line ("" when it logged none).
func gvisorRuntimeField(logs, key string) string {
	for line := range strings.SplitSeq(logs, "\n") {
		if !strings.Contains(line, `msg="gvisor runtime"`) {
			continue
		}
		for f := range strings.FieldsSeq(line) {
			if v, ok := strings.CutPrefix(f, key+"="); ok {
				return v
			}
		}
	}
	return ""
}
