package kube

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/berth-sandbox/berth/test/harness"
)

// scaleMaxPods bounds BERTH_KUBE_SCALE_PODS: the run stays within a few
// minutes on a small host.
const scaleMaxPods = 200

// auditPolicy records every request once it is answered (watches also
// when they start), without bodies.
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
`

// TestScale measures what sandbox pods cost the control plane, for
// docs/scale.md: N pods (BERTH_KUBE_SCALE_PODS, at most 200) created at
// once on one Berth node, held until every one runs, then deleted. The API
// server writes an audit record of every request; from it the test counts
// each client's requests per pod by verb and resource, and the API
// server's own time for them. The client side times create → Running and
// delete → gone. Opt-in (N real sandboxes, minutes): unset, it skips.
func TestScale(t *testing.T) {
	v := os.Getenv("BERTH_KUBE_SCALE_PODS")
	if v == "" {
		t.Skip("set BERTH_KUBE_SCALE_PODS=N (1–200) to measure N sandbox pods against the control plane")
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > scaleMaxPods {
		t.Fatalf("BERTH_KUBE_SCALE_PODS=%q: want 1–%d", v, scaleMaxPods)
	}
	harness.RequireHost(t)
	dir := t.TempDir()
	policy, auditLog := filepath.Join(dir, "audit-policy.yaml"), filepath.Join(dir, "audit.log")
	if err := os.WriteFile(policy, []byte(auditPolicy), 0o600); err != nil {
		t.Fatal(err)
	}
	cp := startControlPlane(t, "--audit-policy-file", policy, "--audit-log-path", auditLog)
	// The default pod capacity (host memory / 512 MiB) is below what the
	// host holds; the pods request nothing, so only this bounds them.
	joinNodes(t, cp, []string{"--max-pods", strconv.Itoa(n + 10)}, "berth-scale")
	// The test stands for the gateway, which would not run at client-go's
	// default 5 requests/s: its own client, unthrottled at this scale.
	rc := rest.CopyConfig(cp.Config)
	rc.QPS, rc.Burst = 100, 200
	kc, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	pods := kc.CoreV1().Pods("default")

	// Each phase (create until all run, delete until all are gone) has
	// its own bound.
	ctx, cancel := context.WithTimeout(t.Context(), 8*time.Minute)
	defer cancel()
	sel := metav1.ListOptions{LabelSelector: "app=berth-scale"}
	list, err := pods.List(ctx, sel)
	if err != nil {
		t.Fatalf("list pods: %v", err)
	}
	sel.ResourceVersion = list.ResourceVersion
	w, err := pods.Watch(ctx, sel)
	if err != nil {
		t.Fatalf("watch pods: %v", err)
	}
	defer w.Stop()

	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("scale-%03d", i)
	}
	begin := time.Now()
	created := parallel(t, names, func(name string) error {
		_, err := pods.Create(ctx, scalePod(name), metav1.CreateOptions{})
		return err
	})
	running := awaitPods(t, w, n, 4*time.Minute, func(ev watch.Event, p *corev1.Pod) bool {
		return ev.Type != watch.Deleted && p.Status.Phase == corev1.PodRunning
	})
	allRunning := time.Now()
	toRun := since(created, running)
	t.Logf("pods %d on one node; all created and Running in %v (%.2f pods/s); create → Running: p50 %v p99 %v",
		n, allRunning.Sub(begin).Round(time.Millisecond), float64(n)/allRunning.Sub(begin).Seconds(), harness.Percentile(toRun, 50), harness.Percentile(toRun, 99))

	// At the peak: the size of one pod object as stored (protobuf), and
	// the events the run made so far.
	one, err := pods.Get(ctx, names[0], metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get pod: %v", err)
	}
	events, err := cp.Client.CoreV1().Events("default").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatalf("list events: %v", err)
	}

	deleted := parallel(t, names, func(name string) error {
		return pods.Delete(ctx, name, metav1.DeleteOptions{})
	})
	gone := awaitPods(t, w, n, 4*time.Minute, func(ev watch.Event, _ *corev1.Pod) bool { return ev.Type == watch.Deleted })
	end := time.Now()
	toGo := since(deleted, gone)
	t.Logf("all deleted and gone in %v; delete → gone: p50 %v p99 %v",
		end.Sub(allRunning).Round(time.Millisecond), harness.Percentile(toGo, 50), harness.Percentile(toGo, 99))
	t.Logf("pod object (protobuf, as stored): %d bytes; events in the namespace at the peak: %d (%.2f per pod)",
		one.Size(), len(events.Items), float64(len(events.Items))/float64(n))
	reportAudit(t, auditLog, begin, end, n)
}

func scalePod(name string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": "berth-scale"}},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Tolerations:   []corev1.Toleration{sandboxToleration},
			Containers:    []corev1.Container{{Name: "main", Image: "minimal", Command: []string{"sleep", "3600"}}},
		},
	}
}

// parallel runs fn for every name, ten at a time, and returns when each
// call was made.
func parallel(t *testing.T, names []string, fn func(string) error) map[string]time.Time {
	t.Helper()
	var mu sync.Mutex
	at := map[string]time.Time{}
	next := make(chan string)
	var wg sync.WaitGroup
	for range 10 {
		wg.Go(func() {
			for name := range next {
				now := time.Now()
				if err := fn(name); err != nil {
					t.Errorf("%s: %v", name, err)
					continue
				}
				mu.Lock()
				at[name] = now
				mu.Unlock()
			}
		})
	}
	for _, name := range names {
		next <- name
	}
	close(next)
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	return at
}

// awaitPods reads w until done has held for n pods, and returns when it
// first held for each; it fails after limit.
func awaitPods(t *testing.T, w watch.Interface, n int, limit time.Duration, done func(watch.Event, *corev1.Pod) bool) map[string]time.Time {
	t.Helper()
	at := map[string]time.Time{}
	timeout := time.NewTimer(limit)
	defer timeout.Stop()
	for len(at) < n {
		var ev watch.Event
		var ok bool
		select {
		case ev, ok = <-w.ResultChan():
		case <-timeout.C:
			t.Fatalf("%d of %d pods done after %v", len(at), n, limit)
		}
		if !ok {
			t.Fatalf("pod watch ended with %d of %d pods done", len(at), n)
		}
		p, isPod := ev.Object.(*corev1.Pod)
		if !isPod {
			t.Fatalf("pod watch: %v %T", ev.Type, ev.Object)
		}
		if _, seen := at[p.Name]; !seen && done(ev, p) {
			at[p.Name] = time.Now()
		}
	}
	return at
}

func since(from, to map[string]time.Time) []time.Duration {
	var out []time.Duration
	for name, t0 := range from {
		if t1, ok := to[name]; ok {
			out = append(out, t1.Sub(t0))
		}
	}
	return out
}

// auditEvent is the part of an audit.k8s.io/v1 Event the report reads.
type auditEvent struct {
	AuditID   string `json:"auditID"`
	Stage     string `json:"stage"`
	Verb      string `json:"verb"`
	UserAgent string `json:"userAgent"`
	ObjectRef *struct {
		Resource    string `json:"resource"`
		Subresource string `json:"subresource"`
	} `json:"objectRef"`
	Received time.Time `json:"requestReceivedTimestamp"`
	Stamp    time.Time `json:"stageTimestamp"`
}

// client names who made a request, from its user agent.
func (e auditEvent) client() string {
	switch ua := e.UserAgent; {
	case strings.HasPrefix(ua, "berth"):
		return "node"
	case strings.HasPrefix(ua, "kube-scheduler"):
		return "scheduler"
	case strings.HasPrefix(ua, "kube-apiserver"):
		return "apiserver"
	}
	return "user"
}

func (e auditEvent) resource() string {
	if e.ObjectRef == nil {
		return "(non-resource)"
	}
	if e.ObjectRef.Subresource != "" {
		return e.ObjectRef.Resource + "/" + e.ObjectRef.Subresource
	}
	return e.ObjectRef.Resource
}

// reportAudit logs, from the API server's audit log, the requests made
// between begin and end by client, verb and resource (per pod, and per
// minute for the node's periodic ones), and the API server's time for them.
func reportAudit(t *testing.T, path string, begin, end time.Time, n int) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("audit log: %v", err)
	}
	defer f.Close()
	type key struct{ client, verb, resource string }
	counts := map[key]int{}
	latency := map[key][]time.Duration{}
	seen := map[string]bool{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var e auditEvent
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("audit record %q: %v", sc.Text(), err)
		}
		if e.Received.Before(begin) || e.Received.After(end) {
			continue
		}
		k := key{e.client(), e.Verb, e.resource()}
		if !seen[e.AuditID] {
			seen[e.AuditID] = true
			counts[k]++
		}
		if e.Stage == "ResponseComplete" && e.Verb != "watch" {
			latency[k] = append(latency[k], e.Stamp.Sub(e.Received))
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("audit log: %v", err)
	}
	keys := make([]key, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].client != keys[j].client {
			return keys[i].client < keys[j].client
		}
		return counts[keys[i]] > counts[keys[j]]
	})
	minutes := end.Sub(begin).Minutes()
	t.Logf("requests from %s to %s (%.2f min), %d pods:", begin.Format(time.TimeOnly), end.Format(time.TimeOnly), minutes, n)
	t.Logf("| client | verb | resource | requests | per pod | per min | server p50 | server p99 |")
	total := map[string]int{}
	for _, k := range keys {
		c := counts[k]
		total[k.client] += c
		t.Logf("| %s | %s | %s | %d | %.2f | %.1f | %v | %v |", k.client, k.verb, k.resource, c,
			float64(c)/float64(n), float64(c)/minutes, harness.Percentile(latency[k], 50), harness.Percentile(latency[k], 99))
	}
	for _, c := range []string{"user", "scheduler", "node", "apiserver"} {
		t.Logf("total %s: %d requests, %.2f per pod", c, total[c], float64(total[c])/float64(n))
	}
}
