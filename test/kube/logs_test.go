package kube

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/remotecommand"
	utilexec "k8s.io/client-go/util/exec"
)

// TestLogs: kubectl logs as a Kubernetes user runs it against a Berth
// node, through the API server: --follow sees each line as the container
// prints it and ends when the container does; --timestamps, --since,
// --tail and --limit-bytes select from the log; --previous answers as the
// kubelet does for a container that never restarted. And kubectl exec -t
// runs the command on a terminal.
func TestLogs(t *testing.T) {
	c := startCluster(t, "berth-logs")
	cp := c.cp
	ctx := t.Context()
	pods := cp.Client.CoreV1().Pods("default")

	// The container prints a line, waits for /tmp/go (made by an exec),
	// prints more, waits for /tmp/end, prints its last line and exits.
	p := sandboxPod("chatty", "sh", "-c", `echo first
while [ ! -e /tmp/go ]; do sleep 0.05; done
echo second; echo to-stderr >&2
while [ ! -e /tmp/end ]; do sleep 0.05; done
echo last`)
	if _, err := pods.Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod: %v", err)
	}
	waitPod(t, cp, "default", "chatty", "Running", phase(corev1.PodRunning))

	// kubectl exec -t: the command's stdin and stdout are a terminal.
	if out, code := execTTY(t, cp, "default", "chatty", "sh", "-c", "test -t 0 && test -t 1 && echo on-a-tty; tty"); code != 0 ||
		!strings.Contains(out, "on-a-tty\r\n") || !strings.Contains(out, "/dev/pts/") {
		t.Errorf("exec -t = (%q, %d), want on-a-tty and a /dev/pts terminal (with the tty's CRLF)", out, code)
	}
	if out, _, code := execPod(t, cp, "default", "chatty", "", "sh", "-c", "test -t 1 || echo no-tty"); code != 0 || out != "no-tty\n" {
		t.Errorf("exec without -t = (%q, %d), want no terminal", out, code)
	}

	// --follow --timestamps: the line so far, then each line once the
	// container prints it, then EOF when it exits.
	fctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	rc, err := pods.GetLogs("chatty", &corev1.PodLogOptions{Container: "main", Follow: true, Timestamps: true}).Stream(fctx)
	if err != nil {
		t.Fatalf("logs -f: %v", err)
	}
	defer rc.Close()
	br := bufio.NewReader(rc)
	var stamped []string
	next := func() string {
		t.Helper()
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("logs -f: read: %v (read so far %q)", err, stamped)
		}
		stamped = append(stamped, line)
		return line
	}
	if _, text := splitStamp(t, next()); text != "first\n" {
		t.Fatalf("logs -f first line = %q", text)
	}
	if _, _, code := execPod(t, cp, "default", "chatty", "", "touch", "/tmp/go"); code != 0 {
		t.Fatalf("touch /tmp/go: %d", code)
	}
	// stdout and stderr are read apart: lines printed within a moment of
	// each other on the two may land in either order, as on any kubelet.
	got := map[string]bool{}
	for range 2 {
		_, text := splitStamp(t, next())
		got[text] = true
	}
	if !got["second\n"] || !got["to-stderr\n"] {
		t.Fatalf("logs -f after /tmp/go = %q, want second and to-stderr", stamped[1:])
	}
	if _, _, code := execPod(t, cp, "default", "chatty", "", "touch", "/tmp/end"); code != 0 {
		t.Fatalf("touch /tmp/end: %d", code)
	}
	if _, text := splitStamp(t, next()); text != "last\n" {
		t.Fatalf("logs -f last line = %q", text)
	}
	if rest, err := io.ReadAll(br); err != nil || len(rest) != 0 {
		t.Errorf("logs -f after the container's end = %q, %v; want EOF", rest, err)
	}
	waitPod(t, cp, "default", "chatty", "Succeeded", phase(corev1.PodSucceeded))

	// The whole log, and its options.
	logs := func(opts corev1.PodLogOptions) string {
		t.Helper()
		opts.Container = "main"
		b, err := pods.GetLogs("chatty", &opts).DoRaw(ctx)
		if err != nil {
			t.Fatalf("logs %+v: %v", opts, err)
		}
		return string(b)
	}
	if all := logs(corev1.PodLogOptions{}); all != "first\nsecond\nto-stderr\nlast\n" && all != "first\nto-stderr\nsecond\nlast\n" {
		t.Errorf("logs = %q", all)
	}
	if got := logs(corev1.PodLogOptions{Timestamps: true}); got != strings.Join(stamped, "") {
		t.Errorf("logs --timestamps = %q, want what -f read, %q", got, stamped)
	}
	if got := logs(corev1.PodLogOptions{TailLines: ptr(int64(2))}); !strings.HasSuffix(got, "\nlast\n") || strings.Count(got, "\n") != 2 {
		t.Errorf("logs --tail=2 = %q", got)
	}
	if got := logs(corev1.PodLogOptions{LimitBytes: ptr(int64(3))}); got != "fir" {
		t.Errorf("logs --limit-bytes=3 = %q", got)
	}
	if got := logs(corev1.PodLogOptions{TailLines: ptr(int64(1)), Timestamps: true}); got != stamped[len(stamped)-1] {
		t.Errorf("logs --tail=1 --timestamps = %q, want %q", got, stamped[len(stamped)-1])
	}
	// --since-time travels in whole seconds: from the second of the last
	// line, the lines of that second on, by their own times.
	lastAt, _ := splitStamp(t, stamped[len(stamped)-1])
	since := metav1.NewTime(lastAt.Truncate(time.Second))
	var want string
	for _, l := range stamped {
		if at, text := splitStamp(t, l); !at.Before(since.Time) {
			want += text
		}
	}
	if got := logs(corev1.PodLogOptions{SinceTime: &since}); got != want || !strings.HasSuffix(got, "last\n") {
		t.Errorf("logs --since-time=%s = %q, want %q", since.Format(time.RFC3339), got, want)
	}
	future := metav1.NewTime(lastAt.Add(time.Hour))
	if got := logs(corev1.PodLogOptions{SinceTime: &future}); got != "" {
		t.Errorf("logs --since-time an hour after the last line = %q, want nothing", got)
	}
	if got := logs(corev1.PodLogOptions{SinceSeconds: ptr(int64(24 * 3600))}); strings.Count(got, "\n") != 4 {
		t.Errorf("logs --since=24h = %q, want every line", got)
	}

	// --previous: containers are not restarted on Berth nodes, so there
	// is none, and the answer says so rather than giving the current log.
	prc, err := pods.GetLogs("chatty", &corev1.PodLogOptions{Container: "main", Previous: true}).Stream(ctx)
	if err == nil {
		prc.Close()
	}
	if !apierrors.IsBadRequest(err) || !strings.Contains(err.Error(), `previous terminated container "main" in pod "chatty" not found`) {
		t.Errorf("logs --previous = %#v, want the kubelet's bad request", err)
	}

	if err := pods.Delete(ctx, "chatty", metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete: %v", err)
	}
	waitPodGone(t, cp, "default", "chatty")
}

// splitStamp splits a --timestamps line into its time and the rest.
func splitStamp(t *testing.T, line string) (time.Time, string) {
	t.Helper()
	ts, text, ok := strings.Cut(line, " ")
	at, err := time.Parse(time.RFC3339Nano, ts)
	if !ok || err != nil {
		t.Fatalf("line %q does not start with a timestamp: %v", line, err)
	}
	return at, text
}

// execTTY runs cmd in the pod on a terminal, like kubectl exec -t, and
// returns what the terminal showed and the exit code.
func execTTY(t *testing.T, cp *controlPlane, ns, name string, cmd ...string) (string, int) {
	t.Helper()
	req := cp.Client.CoreV1().RESTClient().Post().Resource("pods").Namespace(ns).Name(name).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Container: "main", Command: cmd, Stdout: true, TTY: true}, scheme.ParameterCodec)
	ex, err := remotecommand.NewSPDYExecutor(cp.Config, "POST", req.URL())
	if err != nil {
		t.Fatalf("exec executor: %v", err)
	}
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	err = ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: &out, Tty: true})
	var ee utilexec.ExitError
	switch {
	case err == nil:
		return out.String(), 0
	case errors.As(err, &ee):
		return out.String(), ee.ExitStatus()
	}
	t.Fatalf("exec -t %v in %s/%s: %v", cmd, ns, name, err)
	return "", -1
}

func ptr[T any](v T) *T { return &v }
