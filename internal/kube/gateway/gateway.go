// Package gateway is Berth's front door for a Kubernetes cluster of Berth
// nodes (berth serve --kubernetes): it serves the native REST API's
// sandbox routes and E2B's API (e2b.go) with each sandbox made as a pod,
// and proxies each sandbox's data plane to the node that runs it. Its only state is one
// shared informer cache of the sandbox pods and one of the Berth nodes,
// so any number of gateways serve the same cluster side by side.
package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	listersv1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	apitypes "github.com/berth-sandbox/berth/api/types"
	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/auth"
	"github.com/berth-sandbox/berth/internal/kube/node"
)

// Labels the gateway puts on its sandbox pods.
const (
	// LabelManagedBy marks a pod as a gateway's sandbox (value
	// ManagedBy): the informer's label selector.
	LabelManagedBy = "app.kubernetes.io/managed-by"
	ManagedBy      = "berth-gateway"
	// LabelOwner is the ID of the API key that created the sandbox;
	// absent for the operator's.
	LabelOwner = "berth.dev/owner"
)

// Annotations the gateway keeps on a sandbox pod besides the node's
// (template, isolation, network, env).
const (
	// AnnotationLabels holds the sandbox's API labels as a JSON object:
	// their grammar is not Kubernetes'.
	AnnotationLabels = "berth.dev/labels"
)

// DefaultNamespace is where sandbox pods are made unless told otherwise.
const DefaultNamespace = "berth-sandboxes"

// containerName is the one container of a sandbox pod.
const containerName = "sandbox"

// Config is a gateway's settings.
type Config struct {
	Kube      kubernetes.Interface
	Namespace string
	// NodeTransport carries data-plane requests to the nodes' kubelet API
	// port: TLS with the gateway's client certificate, verifying the
	// nodes' serving certificates.
	NodeTransport http.RoundTripper
	// Keys, when set, authenticates every caller but of health; without
	// it every caller is the operator.
	Keys auth.Verifier
	// DefaultTemplate is a create's template when it names none.
	DefaultTemplate string
	// DefaultTimeout is a sandbox's lifetime when its create names none
	// (default 10m, as the daemon's); MaxTimeout bounds it (default 24h).
	DefaultTimeout, MaxTimeout time.Duration
	// CreateTimeout bounds the wait for a new pod to run (default 5m).
	CreateTimeout time.Duration
	// Domain is the E2B API's preview domain: a Host
	// "<port>-<id>.<Domain>" names a sandbox (default berth.localhost).
	Domain string
	// E2BNoInternet makes E2B's allow_internet_access: true (the SDKs'
	// default) no egress rather than the open internet, as the daemon's
	// e2b_default_network: none does.
	E2BNoInternet bool
	// OnNodeLost is a create's on_node_lost when it names none:
	// apitypes.OnNodeLostFail (the default) or OnNodeLostRecreate.
	OnNodeLost string
	// SnapshotCopies is how many nodes hold each snapshot (1, the
	// default: only the node that took it); the leader copies a
	// snapshot to more Ready nodes until that many have it
	// (snapcopies.go).
	SnapshotCopies int
	// Dynamic reaches agent-sandbox's SandboxClaims and SandboxWarmPools
	// (claims.go); Claims is ClaimsAuto (the default: through a claim
	// where the CRDs are installed and a pool is labelled for the
	// template) or ClaimsOff (always a pod of the gateway's own).
	Dynamic dynamic.Interface
	Claims  string
	Version string
	Logger  *slog.Logger
}

// Gateway serves the API. Run starts its informers; Handler serves.
type Gateway struct {
	cfg   Config
	log   *slog.Logger
	pods  listersv1.PodNamespaceLister
	nodes listersv1.NodeLister
	// podIndex is the pod informer's store, indexed bySandboxID.
	podIndex cache.Indexer
	// claims is agent-sandbox's API where it is served and Claims is
	// auto; nil otherwise.
	claims *claimAPI
	// factories are started by Run.
	factories []informers.SharedInformerFactory
	synced    []cache.InformerSynced
	proxy     *httputil.ReverseProxy
	mux       *http.ServeMux
	// now is the gateway's clock (a test's, in unit tests).
	now func() time.Time
	// tokenKeys derive E2B sandboxes' tokens (tokens.go): Run loads
	// them and reads them again every tokenKeyReload; keyMu guards them.
	keyMu     sync.Mutex
	tokenKeys tokenKeys
	// bg are the goroutines Run starts beside the informers.
	bg sync.WaitGroup

	// waiters are the creates waiting on a pod, by pod name; the
	// informer's handler wakes them.
	mu      sync.Mutex
	waiters map[string]map[chan struct{}]struct{}
	// nodesMoved is closed at the next change of a Berth node in the
	// informer's cache, and replaced (nodesChanged).
	nodesMoved chan struct{}
}

// New builds a gateway on one shared informer of the namespace's sandbox
// pods and one of the Berth nodes.
func New(cfg Config) (*Gateway, error) {
	if cfg.Kube == nil || cfg.NodeTransport == nil {
		return nil, fmt.Errorf("gateway needs a Kubernetes client and a transport to the nodes: %w", errdefs.ErrInvalidArgument)
	}
	if cfg.Namespace == "" {
		cfg.Namespace = DefaultNamespace
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.DefaultTimeout == 0 {
		cfg.DefaultTimeout = apitypes.DefaultTimeout
	}
	if cfg.MaxTimeout == 0 {
		cfg.MaxTimeout = apitypes.MaxTimeout
	}
	if cfg.CreateTimeout == 0 {
		cfg.CreateTimeout = 5 * time.Minute
	}
	if cfg.SnapshotCopies == 0 {
		cfg.SnapshotCopies = 1
	}
	if cfg.SnapshotCopies < 1 || cfg.SnapshotCopies > maxSnapshotCopies {
		return nil, &errdefs.Error{Code: errdefs.CodeInvalidArgument, Field: "snapshot-copies", Message: fmt.Sprintf("snapshot-copies %d: want 1 to %d", cfg.SnapshotCopies, maxSnapshotCopies)}
	}
	switch cfg.OnNodeLost {
	case "":
		cfg.OnNodeLost = apitypes.OnNodeLostFail
	case apitypes.OnNodeLostFail, apitypes.OnNodeLostRecreate:
	default:
		return nil, fmt.Errorf("on-node-lost %q: want %s or %s: %w", cfg.OnNodeLost, apitypes.OnNodeLostFail, apitypes.OnNodeLostRecreate, errdefs.ErrInvalidArgument)
	}
	switch cfg.Claims {
	case "":
		cfg.Claims = ClaimsAuto
	case ClaimsAuto, ClaimsOff:
	default:
		return nil, fmt.Errorf("sandbox-claims %q: want %s or %s: %w", cfg.Claims, ClaimsAuto, ClaimsOff, errdefs.ErrInvalidArgument)
	}
	g := &Gateway{cfg: cfg, log: cfg.Logger, waiters: map[string]map[chan struct{}]struct{}{}, now: time.Now}
	if cfg.Claims == ClaimsAuto && cfg.Dynamic != nil {
		ok, err := agentSandboxInstalled(cfg)
		if err != nil {
			return nil, err
		}
		if ok {
			if g.claims, err = newClaimAPI(cfg.Dynamic, cfg.Namespace, g.wake); err != nil {
				return nil, err
			}
		}
		g.log.Info("gateway_sandbox_claims", "served", ok)
	}
	podOpts := []informers.SharedInformerOption{informers.WithNamespace(cfg.Namespace)}
	if g.claims == nil {
		// Only the gateway's own pods; with claims, agent-sandbox's pods
		// too (they carry AnnotationSandboxID, which no selector reads).
		podOpts = append(podOpts, informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = LabelManagedBy + "=" + ManagedBy }))
	}
	pf := informers.NewSharedInformerFactoryWithOptions(cfg.Kube, 0, podOpts...)
	nf := informers.NewSharedInformerFactoryWithOptions(cfg.Kube, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = node.TaintKey + "=true" }))
	pi := pf.Core().V1().Pods()
	ni := nf.Core().V1().Nodes()
	wake := func(obj any) {
		if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = t.Obj
		}
		if p, ok := obj.(*corev1.Pod); ok {
			if id := sandboxID(p); id != "" {
				g.wake(id)
			}
		}
	}
	if _, err := pi.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    wake,
		UpdateFunc: func(_, obj any) { wake(obj) },
		DeleteFunc: wake,
	}); err != nil {
		return nil, err
	}
	g.nodesMoved = make(chan struct{})
	nodeMoved := func(any) {
		g.mu.Lock()
		close(g.nodesMoved)
		g.nodesMoved = make(chan struct{})
		g.mu.Unlock()
	}
	if _, err := ni.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    nodeMoved,
		UpdateFunc: func(_, obj any) { nodeMoved(obj) },
		DeleteFunc: nodeMoved,
	}); err != nil {
		return nil, err
	}
	if err := pi.Informer().AddIndexers(cache.Indexers{bySandboxID: indexSandboxID}); err != nil {
		return nil, err
	}
	g.pods = pi.Lister().Pods(cfg.Namespace)
	g.podIndex = pi.Informer().GetIndexer()
	g.nodes = ni.Lister()
	g.synced = []cache.InformerSynced{pi.Informer().HasSynced, ni.Informer().HasSynced}
	g.factories = []informers.SharedInformerFactory{pf, nf}
	g.proxy = g.nodeProxy()
	g.mux = http.NewServeMux()
	g.routes()
	return g, nil
}

// Run starts the informers and waits until their caches are filled; they
// run until ctx ends. Serve only after Run returned nil.
func (g *Gateway) Run(ctx context.Context) error {
	for _, f := range g.factories {
		f.Start(ctx.Done())
	}
	if g.claims != nil {
		g.claims.factory.Start(ctx.Done())
		for _, ok := range g.claims.factory.WaitForCacheSync(ctx.Done()) {
			if !ok {
				return fmt.Errorf("gateway: the SandboxClaim and SandboxWarmPool caches did not fill: %w", errdefs.ErrUnavailable)
			}
		}
	}
	if !cache.WaitForCacheSync(ctx.Done(), g.synced...) {
		return fmt.Errorf("gateway: the pod and node caches did not fill: %w", errdefs.ErrUnavailable)
	}
	if err := g.loadTokenKey(ctx); err != nil {
		return err
	}
	g.bg.Go(func() { g.reloadTokenKeys(ctx) })
	return nil
}

// Shutdown waits for the informers' goroutines once ctx (Run's) ended.
func (g *Gateway) Shutdown() {
	for _, f := range g.factories {
		f.Shutdown()
	}
	if g.claims != nil {
		g.claims.factory.Shutdown()
	}
	g.bg.Wait()
}

// Handler returns the root HTTP handler.
func (g *Gateway) Handler() http.Handler { return http.HandlerFunc(g.serveHTTP) }

// watch registers a waiter for the changes of the sandbox id's pod (and
// claim); cancel unregisters it.
func (g *Gateway) watch(name string) (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	g.mu.Lock()
	if g.waiters[name] == nil {
		g.waiters[name] = map[chan struct{}]struct{}{}
	}
	g.waiters[name][ch] = struct{}{}
	g.mu.Unlock()
	return ch, func() {
		g.mu.Lock()
		delete(g.waiters[name], ch)
		if len(g.waiters[name]) == 0 {
			delete(g.waiters, name)
		}
		g.mu.Unlock()
	}
}

// wake tells the pod's waiters it changed (they read it from the cache).
func (g *Gateway) wake(name string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for ch := range g.waiters[name] {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// Serve answers on listen until ctx ends, then stops taking requests and
// waits (up to 10s) for those in flight.
func (g *Gateway) Serve(ctx context.Context, listen string) error {
	srv := &http.Server{Addr: listen, Handler: g.Handler(), ReadHeaderTimeout: 30 * time.Second,
		ErrorLog: slog.NewLogLogger(g.log.Handler(), slog.LevelDebug)}
	errc := make(chan error, 1)
	go func() { errc <- srv.ListenAndServe() }()
	g.log.Info("gateway_serving", "listen", listen, "namespace", g.cfg.Namespace)
	select {
	case err := <-errc:
		return fmt.Errorf("gateway listen %s: %w", listen, err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	err := srv.Shutdown(sctx)
	if lerr := <-errc; !errors.Is(lerr, http.ErrServerClosed) {
		err = errors.Join(err, lerr)
	}
	return err
}
