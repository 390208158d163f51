package gateway

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	ktypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	coordlisters "k8s.io/client-go/listers/coordination/v1"
	listersv1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/kube/node"
)

// LifecycleConfig is how one gateway replica among several looks after
// the sandbox pods besides serving the API: one replica at a time, the
// leader elected on a Lease in the gateway's namespace, deletes the pods
// of sandboxes that ended and acts on nodes that are lost.
type LifecycleConfig struct {
	// Identity names this replica in the leader Lease (default
	// hostname_pid).
	Identity string
	// LeaseName is the leader Lease's name (default DefaultLeaderLease).
	LeaseName string
	// KeepEnded is how long a sandbox that ended (its pod Succeeded or
	// Failed) stays listed before its pod is deleted; 0 deletes it at
	// once. Measured on the leader's clock from when it saw it end.
	KeepEnded time.Duration
	// NodeLostAfter is how long a Berth node's Lease in kube-node-lease
	// may go without a change, as the leader sees it, before the node is
	// lost (default 40s, the node lifecycle controller's grace).
	NodeLostAfter time.Duration
	// Every is how often the leader looks (default 1s).
	Every time.Duration
	// LeaseDuration, RenewDeadline and RetryPeriod are the leader
	// election's (default 15s, 10s, 2s, as Kubernetes' own controllers).
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
}

// DefaultLeaderLease is the leader Lease's name in the gateway's namespace.
const DefaultLeaderLease = "berth-gateway"

// nodeLeaseNamespace is where nodes renew their Leases.
const nodeLeaseNamespace = corev1.NamespaceNodeLease

func (c *LifecycleConfig) defaults() error {
	if c.Identity == "" {
		host, err := os.Hostname()
		if err != nil {
			return fmt.Errorf("leader identity: %w", err)
		}
		c.Identity = fmt.Sprintf("%s_%d", host, os.Getpid())
	}
	if c.LeaseName == "" {
		c.LeaseName = DefaultLeaderLease
	}
	if c.NodeLostAfter == 0 {
		c.NodeLostAfter = 40 * time.Second
	}
	if c.Every == 0 {
		c.Every = time.Second
	}
	if c.LeaseDuration == 0 {
		c.LeaseDuration = 15 * time.Second
	}
	if c.RenewDeadline == 0 {
		c.RenewDeadline = 10 * time.Second
	}
	if c.RetryPeriod == 0 {
		c.RetryPeriod = 2 * time.Second
	}
	if c.KeepEnded < 0 || c.NodeLostAfter < 0 || c.Every < 0 {
		return fmt.Errorf("keep-ended, node-lost-after: want durations of 0 or more: %w", errdefs.ErrInvalidArgument)
	}
	return nil
}

// RunLifecycle takes part in the gateway replicas' leader election until
// ctx ends; while this replica leads, it clears away ended sandboxes,
// acts on lost nodes (lost.go) and brings the nodes' templates to the
// cluster's record (templatesync.go). A replica that does not lead still serves
// the API. Call it after Run returned nil.
func (g *Gateway) RunLifecycle(ctx context.Context, cfg LifecycleConfig) error {
	if err := cfg.defaults(); err != nil {
		return err
	}
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: g.cfg.Namespace, Name: cfg.LeaseName},
		Client:     g.cfg.Kube.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: cfg.Identity},
	}
	// A term's work is owned here: a term that ends stops its sweeps
	// through its context, and RunLifecycle waits for them.
	var (
		mu     sync.Mutex
		closed bool
		wg     sync.WaitGroup
	)
	defer func() {
		mu.Lock()
		closed = true
		mu.Unlock()
		wg.Wait()
	}()
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock: lock, Name: cfg.LeaseName,
		LeaseDuration: cfg.LeaseDuration, RenewDeadline: cfg.RenewDeadline, RetryPeriod: cfg.RetryPeriod,
		ReleaseOnCancel: true,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(lctx context.Context) {
				mu.Lock()
				if closed {
					mu.Unlock()
					return
				}
				wg.Add(1)
				mu.Unlock()
				defer wg.Done()
				g.log.Info("gateway_leading", "identity", cfg.Identity, "lease", cfg.LeaseName)
				if err := g.lead(lctx, cfg); err != nil && lctx.Err() == nil {
					g.log.Error("gateway_lead_failed", "err", err)
				}
			},
			OnStoppedLeading: func() {},
			OnNewLeader: func(id string) {
				g.log.Info("gateway_leader", "identity", id)
			},
		},
	})
	if err != nil {
		return fmt.Errorf("leader election: %w", err)
	}
	// Run returns when the term ends; stand again until ctx ends.
	for ctx.Err() == nil {
		le.Run(ctx)
	}
	return nil
}

// lead is one term of leadership: the node Leases' informer runs for it,
// and a sweep each cfg.Every until ctx ends.
func (g *Gateway) lead(ctx context.Context, cfg LifecycleConfig) error {
	f := informers.NewSharedInformerFactoryWithOptions(g.cfg.Kube, 0, informers.WithNamespace(nodeLeaseNamespace))
	li := f.Coordination().V1().Leases()
	informer := li.Informer()
	f.Start(ctx.Done())
	defer f.Shutdown()
	// The fork snapshots' records (forkgc.go), one watch.
	ff := informers.NewSharedInformerFactoryWithOptions(g.cfg.Kube, 0, informers.WithNamespace(g.cfg.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = LabelSnapshotFork + "=true" }))
	forks := ff.Core().V1().ConfigMaps()
	forksInformer := forks.Informer()
	ff.Start(ctx.Done())
	defer ff.Shutdown()
	// The records of pods being made again after their node was lost.
	rf := informers.NewSharedInformerFactoryWithOptions(g.cfg.Kube, 0, informers.WithNamespace(g.cfg.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = LabelRemake + "=true" }))
	remakes := rf.Core().V1().ConfigMaps()
	remakesInformer := remakes.Informer()
	rf.Start(ctx.Done())
	defer rf.Shutdown()
	// Every snapshot's record, for their copies (snapcopies.go).
	sf := informers.NewSharedInformerFactoryWithOptions(g.cfg.Kube, 0, informers.WithNamespace(g.cfg.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = LabelSnapshot }))
	snaps := sf.Core().V1().ConfigMaps()
	snapsInformer := snaps.Informer()
	sf.Start(ctx.Done())
	defer sf.Shutdown()
	// The cluster's template record (templatesync.go), one object.
	tf := informers.NewSharedInformerFactoryWithOptions(g.cfg.Kube, 0, informers.WithNamespace(g.cfg.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.FieldSelector = "metadata.name=" + TemplatesConfigMap }))
	tpls := tf.Core().V1().ConfigMaps()
	tplsInformer := tpls.Informer()
	tf.Start(ctx.Done())
	defer tf.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), informer.HasSynced, forksInformer.HasSynced, tplsInformer.HasSynced, remakesInformer.HasSynced, snapsInformer.HasSynced) {
		return fmt.Errorf("node leases, fork snapshots, template record, remake records or snapshot records cache did not fill: %w", errdefs.ErrUnavailable)
	}
	tsync, ssync := newSyncWork(g.now), newSyncWork(g.now)
	defer tsync.wg.Wait()
	defer ssync.wg.Wait()
	l := newLifecycle(g.cfg.Kube, g.cfg.Namespace, g.pods, g.nodes, li.Lister().Leases(nodeLeaseNamespace), cfg, g.cfg.OnNodeLost, g.log)
	l.claims = g.claims
	l.remakes = remakes.Lister().ConfigMaps(g.cfg.Namespace)
	t := time.NewTicker(cfg.Every)
	defer t.Stop()
	tried := map[string]time.Time{}
	for {
		l.sweep(ctx, g.now())
		g.sweepForks(ctx, forks.Lister().ConfigMaps(g.cfg.Namespace), tried, g.now())
		cm, _ := tpls.Lister().ConfigMaps(g.cfg.Namespace).Get(TemplatesConfigMap)
		g.syncTemplates(ctx, tsync, cm)
		if recs, err := snaps.Lister().ConfigMaps(g.cfg.Namespace).List(labels.Everything()); err == nil {
			g.copySnapshots(ctx, ssync, recs)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// lifecycle is the leader's view: what it saw of each node's Lease and
// when each ended pod was first seen ended, on its own clock.
type lifecycle struct {
	kube   kubernetes.Interface
	ns     string
	pods   listersv1.PodNamespaceLister
	nodes  listersv1.NodeLister
	leases coordlisters.LeaseNamespaceLister
	cfg    LifecycleConfig
	// policy is the gateway's on_node_lost default, for pods without
	// AnnotationOnNodeLost.
	policy string
	log    *slog.Logger
	// claims deletes the claims of sandboxes made through one.
	claims *claimAPI

	seen  map[string]leaseSeen
	ended map[ktypes.UID]time.Time
	// remakes lists the records of pods to make again (lost.go).
	remakes listersv1.ConfigMapNamespaceLister
}

func newLifecycle(kube kubernetes.Interface, ns string, pods listersv1.PodNamespaceLister, nodes listersv1.NodeLister,
	leases coordlisters.LeaseNamespaceLister, cfg LifecycleConfig, policy string, log *slog.Logger) *lifecycle {
	return &lifecycle{kube: kube, ns: ns, pods: pods, nodes: nodes, leases: leases, cfg: cfg, policy: policy, log: log,
		seen: map[string]leaseSeen{}, ended: map[ktypes.UID]time.Time{}}
}

// sweep looks once at every Berth node and sandbox pod, as of now.
func (l *lifecycle) sweep(ctx context.Context, now time.Time) {
	lost := l.sweepNodes(ctx, now)
	l.sweepRemakes(ctx)
	pods, err := l.pods.List(everything())
	if err != nil {
		l.log.Warn("lifecycle_list_failed", "err", err)
		return
	}
	present := map[ktypes.UID]bool{}
	for _, pod := range pods {
		if sandboxID(pod) == "" {
			continue // a warm pool's pod, not a sandbox yet
		}
		present[pod.UID] = true
		switch {
		case pod.DeletionTimestamp != nil:
		case podEnded(pod):
			l.reap(ctx, pod, now)
		case pod.Spec.NodeName != "" && lost[pod.Spec.NodeName] != "":
			l.nodeLost(ctx, pod, lost[pod.Spec.NodeName])
		}
	}
	for uid := range l.ended {
		if !present[uid] {
			delete(l.ended, uid)
		}
	}
}

func podEnded(pod *corev1.Pod) bool {
	return pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed
}

// reap deletes an ended sandbox's pod once it has been seen ended for
// KeepEnded. A sandbox reported lost under the fail policy stays listed
// until it is deleted.
func (l *lifecycle) reap(ctx context.Context, pod *corev1.Pod, now time.Time) {
	if pod.Annotations[node.AnnotationLost] != "" {
		return
	}
	first, ok := l.ended[pod.UID]
	if !ok {
		first = now
		l.ended[pod.UID] = now
	}
	if now.Sub(first) < l.cfg.KeepEnded {
		return
	}
	// A claim's pod goes with its claim: agent-sandbox would make it
	// again were only the pod deleted.
	del := l.deletePod
	if claimed(pod) {
		del = l.claims.delete
	}
	if err := del(ctx, pod); err != nil && !isNotFound(err) {
		l.log.Warn("sandbox_pod_reap_failed", "sandbox_id", sandboxID(pod), "err", err)
		return
	}
	l.log.Info("sandbox_pod_reaped", "sandbox_id", sandboxID(pod), "phase", pod.Status.Phase, "reason", endReason(pod))
}

// deletePod deletes the pod at once, only if it is still the one with
// its UID (gone already is done).
func (l *lifecycle) deletePod(ctx context.Context, pod *corev1.Pod) error {
	zero := int64(0)
	uid := pod.UID
	err := l.kube.CoreV1().Pods(l.ns).Delete(ctx, pod.Name, metav1.DeleteOptions{
		GracePeriodSeconds: &zero, Preconditions: &metav1.Preconditions{UID: &uid}})
	if err != nil {
		if err := kubeErr("delete sandbox pod "+pod.Name, err); !isNotFound(err) {
			return err
		}
	}
	return nil
}

// leaseRenew is the Lease's renew time as a value to compare, "" without
// one.
func leaseRenew(lease *coordinationv1.Lease) string {
	if lease == nil || lease.Spec.RenewTime == nil {
		return ""
	}
	return lease.Spec.RenewTime.UTC().Format(time.RFC3339Nano)
}
