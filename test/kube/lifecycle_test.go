package kube

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ktypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/berth-sandbox/berth/client"
	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/kube/gateway"
	"github.com/berth-sandbox/berth/internal/kube/node"
	"github.com/berth-sandbox/berth/test/harness"
)

// nodeLostAfter is the gateways' --node-lost-after: above the nodes'
// lease renewal (every 10 s, the kubelet's) with room for one late one.
const nodeLostAfter = "25s"

// TestGatewayLifecycle: two gateway replicas, one elected leader.
// (a) A sandbox's deadline moves after create: the node follows the
// pod's deadline annotation and the pod ends at the new deadline, not the
// first; the leader then deletes the ended pod (--keep-ended 0) and the
// node destroys the sandbox. The leader replica stops; the other takes
// over. (b) A Berth node is SIGKILLed: once its lease has not changed for
// --node-lost-after, its sandbox under on_node_lost fail reads lost
// through the API, the one under recreate runs again, same ID, on the
// other node and answers exec, and the lost node is tainted unreachable.
// The node comes back with the same data dir: the taint goes, its old
// sandboxes are destroyed, the lost pod fails NodeLost, nothing leaks.
func TestGatewayLifecycle(t *testing.T) {
	c := startCluster(t, "berth-a", "berth-b")
	cp := c.cp
	ctx := t.Context()
	ns := gateway.DefaultNamespace
	keys, cert := gatewaySetup(t, cp, nil)
	flags := func(id string) []string {
		return []string{"--keep-ended", "0", "--node-lost-after", nodeLostAfter, "--leader-id", id, "--snapshot-copies", "2"}
	}
	gws, stops := map[string]*client.Client{}, map[string]func(){}
	for _, id := range []string{"gateway-a", "gateway-b"} {
		gws[id], stops[id] = startGatewayProc(t, cp, id, keys, cert, flags(id)...)
	}
	pods := cp.Client.CoreV1().Pods(ns)

	// One replica leads, on the Lease in the gateway's namespace.
	leader := waitLeader(t, cp, ns, "")
	gw := gws[leader]

	// (a) A deadline moved after create. Every change of the pod, in
	// order, from before its create.
	_, events := watchPods(t, cp, ns)
	sb, err := gw.Create(ctx, client.CreateRequest{Timeout: "15s"})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	created, err := pods.Get(ctx, sb.ID, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	first := created.Annotations[node.AnnotationDeadline]
	if first == "" || sb.Deadline.UTC().Format(time.RFC3339) != first {
		t.Fatalf("created with deadline %v, annotation %q", sb.Deadline, first)
	}
	nodeSb := podSandboxes(t, c.nodes[created.Spec.NodeName], string(created.UID))
	if len(nodeSb) != 1 {
		t.Fatalf("pod %s: node sandboxes %v", sb.ID, ids(nodeSb))
	}
	d := c.nodes[created.Spec.NodeName]
	// Through the other replica: its cache has the sandbox once its
	// watch delivered it.
	var other *client.Client
	for id, g := range gws {
		if id != leader {
			other = g
		}
	}
	harness.WaitFor(t, 30*time.Second, "the other replica to see the sandbox ready", func() bool {
		got, err := other.Get(ctx, sb.ID)
		return err == nil && got.State == client.StateReady
	})
	extended, err := other.SetTimeout(ctx, sb.ID, 30*time.Second)
	if err != nil {
		t.Fatalf("set timeout: %v", err)
	}
	second := extended.Deadline.UTC().Format(time.RFC3339)
	if !extended.Deadline.After(sb.Deadline) || extended.State != client.StateReady {
		t.Fatalf("extended = %+v; first deadline %s", extended.Sandbox, first)
	}
	// The node sets the sandbox's deadline from the annotation: at it,
	// or within the second after (the daemon takes a timeout from now).
	harness.WaitFor(t, time.Minute, "the node to move the sandbox's deadline", func() bool {
		got, err := d.Local.Get(ctx, nodeSb[0].ID)
		return err == nil && !got.Deadline.Before(extended.Deadline) && got.Deadline.Before(extended.Deadline.Add(2*time.Second))
	})
	if _, err := other.SetTimeout(ctx, sb.ID, 48*time.Hour); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("set timeout 48h = %v, want invalid argument", err)
	}
	// The pod's changes until it is deleted: it ends by the second
	// deadline (the message names it), then the leader deletes it.
	var ended *corev1.Pod
	deleted := false
	wctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	for !deleted {
		select {
		case ev, ok := <-events.ResultChan():
			if !ok {
				t.Fatal("pod watch ended")
			}
			p, isPod := ev.Object.(*corev1.Pod)
			if !isPod || p.Name != sb.ID {
				continue
			}
			if ev.Type == watch.Deleted {
				deleted = true
			} else if p.Status.Phase == corev1.PodFailed && ended == nil {
				ended = p
			}
		case <-wctx.Done():
			t.Fatalf("pod %s not ended and deleted; ended: %v", sb.ID, ended != nil)
		}
	}
	cancel()
	if ended == nil {
		t.Fatalf("pod %s deleted without being seen ended", sb.ID)
	}
	if ended.Status.Reason != node.ReasonDeadlineExceeded || !strings.Contains(ended.Status.Message, second) || ended.Annotations[node.AnnotationDeadline] != second {
		t.Errorf("pod ended %s: %q (deadline annotation %q), want %s at %s", ended.Status.Reason, ended.Status.Message, ended.Annotations[node.AnnotationDeadline], node.ReasonDeadlineExceeded, second)
	}
	fctx, fcancel := context.WithTimeout(ctx, 2*time.Minute)
	if err := d.Local.FollowEvents(fctx, nodeSb[0].ID, func(client.Event) error { return nil }); err != nil {
		t.Errorf("node sandbox %s after the deadline: %v", nodeSb[0].ID, err)
	}
	fcancel()
	if got, err := d.Local.Get(ctx, nodeSb[0].ID); err == nil && got.State != client.StateStopped {
		t.Errorf("node sandbox after the deadline is %s", got.State)
	}
	harness.WaitFor(t, 30*time.Second, "the gateway to drop the reaped sandbox", func() bool {
		_, err := gw.Get(ctx, sb.ID)
		return errors.Is(err, errdefs.ErrNotFound)
	})

	// The leader stops (releasing its Lease); the other replica leads
	// and serves the rest.
	stops[leader]()
	leader = waitLeader(t, cp, ns, leader)
	gw = gws[leader]

	// (b) A lost node. Both sandboxes go to berth-a: berth-b takes no
	// new pod while they are made.
	setUnschedulable(t, cp, "berth-b", true)
	failing, err := gw.Create(ctx, client.CreateRequest{OnNodeLost: client.OnNodeLostFail, Timeout: "20m"})
	if err != nil {
		t.Fatalf("create (fail): %v", err)
	}
	remade, err := gw.Create(ctx, client.CreateRequest{OnNodeLost: client.OnNodeLostRecreate, Timeout: "20m", Env: map[string]string{"WHO": "remade"}})
	if err != nil {
		t.Fatalf("create (recreate): %v", err)
	}
	// A snapshot of a sandbox on berth-a, with a file in it: the leader
	// copies it to berth-b (--snapshot-copies 2) under its ID. A sandbox
	// made from it (on berth-a, berth-b still closed) is to be made
	// again from the copy when berth-a is lost.
	var out bytes.Buffer
	if code, err := gw.Sandbox(remade.ID).Exec(ctx, client.ExecRequest{Cmd: "/bin/sh", Args: []string{"-c", "echo kept > /kept"}, Stdout: &out}); err != nil || code != 0 {
		t.Fatalf("write a file = %d, %v", code, err)
	}
	snap, err := gw.Snapshot(ctx, remade.ID, "kept")
	if err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	fromSnap, err := gw.Create(ctx, client.CreateRequest{Snapshot: snap.ID, OnNodeLost: client.OnNodeLostRecreate, Timeout: "20m"})
	if err != nil {
		t.Fatalf("create from the snapshot: %v", err)
	}
	harness.WaitFor(t, 2*time.Minute, "the leader to copy the snapshot to berth-b", func() bool {
		for _, id := range []string{snap.ID} {
			if s, err := c.nodes["berth-b"].Local.GetSnapshot(ctx, id); err != nil || s.ID != id || s.Labels[node.LabelNode] != "berth-b" {
				return false
			}
		}
		rec, err := cp.Client.CoreV1().ConfigMaps(ns).Get(ctx, "berth-snapshot-"+snap.ID, metav1.GetOptions{})
		return err == nil && rec.Data["copies"] == `["berth-b"]`
	})
	if got, err := gw.GetSnapshot(ctx, snap.ID); err != nil || !slices.Equal(got.Nodes, []string{"berth-a", "berth-b"}) {
		t.Errorf("snapshot through the gateway = %+v, %v: want it held by berth-a and berth-b", got, err)
	}
	setUnschedulable(t, cp, "berth-b", false)
	old := map[string]*corev1.Pod{}
	for _, id := range []string{failing.ID, remade.ID, fromSnap.ID} {
		p, err := pods.Get(ctx, id, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if p.Spec.NodeName != "berth-a" {
			t.Fatalf("pod %s on %s, want berth-a", id, p.Spec.NodeName)
		}
		old[id] = p
	}
	lostNode := c.nodes["berth-a"]
	oldSb := map[string]string{}
	for id, p := range old {
		live := podSandboxes(t, lostNode, string(p.UID))
		if len(live) != 1 {
			t.Fatalf("pod %s: node sandboxes %v", id, ids(live))
		}
		oldSb[id] = live[0].ID
	}

	lostNode.Kill9()
	waitPod(t, cp, ns, failing.ID, "reported lost", func(p *corev1.Pod) bool { return p.Annotations[node.AnnotationLost] != "" })
	harness.WaitFor(t, 30*time.Second, "the gateway to read the sandbox lost", func() bool {
		got, err := gw.Get(ctx, failing.ID)
		return err == nil && got.State == client.StateLost && strings.Contains(got.Reason, "berth-a")
	})
	again := waitPod(t, cp, ns, remade.ID, "Running again on berth-b", func(p *corev1.Pod) bool {
		return p.UID != old[remade.ID].UID && p.Spec.NodeName == "berth-b" && p.Status.Phase == corev1.PodRunning && len(p.Status.ContainerStatuses) == 1 &&
			p.Status.ContainerStatuses[0].ContainerID != ""
	})
	if again.Annotations[gateway.AnnotationRecreated] != "1" || again.Annotations[gateway.AnnotationLostNode] != "berth-a" {
		t.Errorf("recreated pod annotations = %v", again.Annotations)
	}
	waitNode(t, cp, "berth-a", func(n *corev1.Node) bool { return hasTaint(n, corev1.TaintNodeUnreachable) })
	harness.WaitFor(t, 30*time.Second, "the gateway to read the recreated sandbox ready", func() bool {
		got, err := gw.Get(ctx, remade.ID)
		return err == nil && got.State == client.StateReady
	})
	out.Reset()
	if code, err := gw.Sandbox(remade.ID).Exec(ctx, client.ExecRequest{Cmd: "/bin/sh", Args: []string{"-c", `echo "$WHO" again`}, Stdout: &out}); err != nil || code != 0 || out.String() != "remade again\n" {
		t.Errorf("exec in the recreated sandbox = %d, %v, %q", code, err, out.String())
	}
	if _, err := gw.Sandbox(failing.ID).Exec(ctx, client.ExecRequest{Cmd: "true"}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("exec in a lost sandbox = %v, want failed precondition", err)
	}
	// The sandbox from the snapshot runs again on berth-b, from its copy;
	// so does a new one made from it while berth-a is lost.
	waitPod(t, cp, ns, fromSnap.ID, "Running again on berth-b", func(p *corev1.Pod) bool {
		return p.UID != old[fromSnap.ID].UID && p.Spec.NodeName == "berth-b" && p.Status.Phase == corev1.PodRunning
	})
	harness.WaitFor(t, 30*time.Second, "the gateway to read the sandbox from the snapshot ready", func() bool {
		got, err := gw.Get(ctx, fromSnap.ID)
		return err == nil && got.State == client.StateReady
	})
	fromCopy, err := gw.Create(ctx, client.CreateRequest{Snapshot: snap.ID, Timeout: "20m"})
	if err != nil {
		t.Fatalf("create from the snapshot with berth-a lost: %v", err)
	}
	for _, id := range []string{fromSnap.ID, fromCopy.ID} {
		out.Reset()
		if code, err := gw.Sandbox(id).Exec(ctx, client.ExecRequest{Cmd: "cat", Args: []string{"/kept"}, Stdout: &out}); err != nil || code != 0 || out.String() != "kept\n" {
			t.Errorf("%s from the snapshot's copy: cat /kept = %d, %v, %q", id, code, err, out.String())
		}
		if p, err := pods.Get(ctx, id, metav1.GetOptions{}); err != nil || p.Spec.NodeName != "berth-b" {
			t.Errorf("%s from the snapshot's copy runs on %v (%v), want berth-b", id, p.Spec.NodeName, err)
		}
	}

	// berth-a comes back with its data dir: the taint goes, the lost
	// pod fails NodeLost (and still reads lost), its old sandboxes are
	// destroyed.
	restarted := time.Now()
	lostNode.Start()
	waitNode(t, cp, "berth-a", func(n *corev1.Node) bool {
		for _, cond := range n.Status.Conditions {
			if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue && cond.LastHeartbeatTime.Unix() > restarted.Unix() {
				return !hasTaint(n, corev1.TaintNodeUnreachable)
			}
		}
		return false
	})
	failed := waitPod(t, cp, ns, failing.ID, "Failed NodeLost", phase(corev1.PodFailed))
	if failed.Status.Reason != node.ReasonNodeLost || failed.Status.Message != failed.Annotations[node.AnnotationLost] {
		t.Errorf("lost pod once its node is back: %s: %q", failed.Status.Reason, failed.Status.Message)
	}
	if got, err := gw.Get(ctx, failing.ID); err != nil || got.State != client.StateLost {
		t.Errorf("lost sandbox once its node is back = %+v, %v", got, err)
	}
	for id, sbID := range oldSb {
		if live := podSandboxes(t, lostNode, string(old[id].UID)); len(live) != 0 {
			t.Errorf("pod %s's old sandboxes on the node back: %v", id, ids(live))
		}
		if got, err := lostNode.Local.Get(ctx, sbID); err == nil && got.State != client.StateStopped {
			t.Errorf("old sandbox %s of %s is %s", sbID, id, got.State)
		}
	}

	// Deleted through the API, nothing is left on either node. A pod
	// deleted with no grace leaves the API before its node destroys the
	// sandbox: follow the sandbox's events until it is destroyed.
	newSb := podSandboxes(t, c.nodes["berth-b"], string(again.UID))
	if len(newSb) != 1 {
		t.Fatalf("recreated pod: sandboxes on berth-b %v", ids(newSb))
	}
	for _, id := range []string{fromSnap.ID, fromCopy.ID} {
		if err := gw.Kill(ctx, id); err != nil {
			t.Errorf("delete %s: %v", id, err)
		}
		waitPodGone(t, cp, ns, id)
	}
	// The snapshot's delete removes it from both nodes, and its record.
	harness.WaitFor(t, time.Minute, "the snapshot's delete, once its sandboxes are gone", func() bool {
		return gw.RemoveSnapshot(ctx, snap.ID) == nil
	})
	for name, d := range c.nodes {
		if _, err := d.Local.GetSnapshot(ctx, snap.ID); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("snapshot %s on %s after its delete: %v", snap.ID, name, err)
		}
	}
	for _, id := range []string{failing.ID, remade.ID} {
		if err := gw.Kill(ctx, id); err != nil {
			t.Errorf("delete %s: %v", id, err)
		}
		waitPodGone(t, cp, ns, id)
	}
	fctx, fcancel = context.WithTimeout(ctx, 2*time.Minute)
	if err := c.nodes["berth-b"].Local.FollowEvents(fctx, newSb[0].ID, func(client.Event) error { return nil }); err != nil {
		t.Errorf("recreated sandbox %s after delete: %v", newSb[0].ID, err)
	}
	fcancel()
	for _, d := range c.nodes {
		harness.AssertNoLeaks(t, d)
	}
}

// waitLeader watches the gateways' leader Lease until a replica other
// than not holds it, and returns its identity.
func waitLeader(t *testing.T, cp *controlPlane, ns, not string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	leases := cp.Client.CoordinationV1().Leases(ns)
	for ctx.Err() == nil {
		l, err := leases.Get(ctx, gateway.DefaultLeaderLease, metav1.GetOptions{})
		rv := ""
		if err == nil {
			if h := l.Spec.HolderIdentity; h != nil && *h != "" && *h != not {
				return *h
			}
			rv = l.ResourceVersion
		}
		w, err := leases.Watch(ctx, metav1.ListOptions{ResourceVersion: rv})
		if err != nil {
			t.Fatalf("watch leases: %v", err)
		}
		for range w.ResultChan() {
			// Read it again on each change.
			break
		}
		w.Stop()
	}
	t.Fatalf("no gateway replica but %q leads", not)
	return ""
}

func setUnschedulable(t *testing.T, cp *controlPlane, name string, on bool) {
	t.Helper()
	patch := fmt.Sprintf(`{"spec":{"unschedulable":%v}}`, on)
	if _, err := cp.Client.CoreV1().Nodes().Patch(t.Context(), name, ktypes.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatalf("node %s unschedulable=%v: %v", name, on, err)
	}
}

func hasTaint(n *corev1.Node, key string) bool {
	for _, t := range n.Spec.Taints {
		if t.Key == key {
			return true
		}
	}
	return false
}
