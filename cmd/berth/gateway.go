//go:build linux

package main

import (
	"errors"
	"fmt"
	"log/slog"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/berth-sandbox/berth/errdefs"
	"github.com/berth-sandbox/berth/internal/auth"
	"github.com/berth-sandbox/berth/internal/daemon"
	"github.com/berth-sandbox/berth/internal/kube/gateway"
)

// gatewayOptions are the flags of `berth serve --kubernetes`.
type gatewayOptions struct {
	on            bool
	kubeconfig    string
	namespace     string
	nodeCert      string
	nodeKey       string
	nodeCA        string
	apiKeys       string
	createTimeout time.Duration
	apiQPS        float64
	apiBurst      int
	lifecycle     gateway.LifecycleConfig
	onNodeLost    string
	claims        string
	e2bNetwork    string
	snapCopies    int
}

func (g *gatewayOptions) bind(f *pflag.FlagSet) {
	f.BoolVar(&g.on, "kubernetes", false, "serve as the gateway of a Kubernetes cluster of Berth nodes: sandboxes are pods, no local runtime or state (see --kubeconfig, --namespace, --node-client-cert)")
	f.StringVar(&g.kubeconfig, "kubeconfig", "", "with --kubernetes: kubeconfig of the cluster (default: the pod's in-cluster config)")
	f.StringVar(&g.namespace, "namespace", gateway.DefaultNamespace, "with --kubernetes: namespace of the sandbox pods")
	f.StringVar(&g.nodeCert, "node-client-cert", "", "with --kubernetes: client certificate (PEM) toward the nodes' kubelet API port, signed by their --client-ca (as the API server's --kubelet-client-certificate)")
	f.StringVar(&g.nodeKey, "node-client-key", "", "with --kubernetes: its key (PEM)")
	f.StringVar(&g.nodeCA, "node-ca", "", "with --kubernetes: CA (PEM) that signed the nodes' --tls-cert (as the API server's --kubelet-certificate-authority)")
	f.StringVar(&g.apiKeys, "api-keys", "", "with --kubernetes: API keys file (YAML: keys: [{id, name, sha256, admin}]); every route but health then needs a key")
	f.DurationVar(&g.createTimeout, "create-timeout", 5*time.Minute, "with --kubernetes: how long a create waits for its pod to run")
	f.Float64Var(&g.apiQPS, "kube-api-qps", defaultKubeAPIQPS, "with --kubernetes: requests per second to the API server at most")
	f.IntVar(&g.apiBurst, "kube-api-burst", defaultKubeAPIBurst, "with --kubernetes: requests above --kube-api-qps sent at once")
	f.DurationVar(&g.lifecycle.KeepEnded, "keep-ended", 5*time.Minute, "with --kubernetes: how long a sandbox that ended stays listed before its pod is deleted (0: at once)")
	f.DurationVar(&g.lifecycle.NodeLostAfter, "node-lost-after", 40*time.Second, "with --kubernetes: a Berth node whose lease has not changed for this long is lost: its sandboxes are reported lost or made again (--on-node-lost)")
	f.StringVar(&g.claims, "sandbox-claims", gateway.ClaimsAuto, "with --kubernetes: auto makes a sandbox through an agent-sandbox SandboxClaim where those CRDs are installed and a SandboxWarmPool in --namespace is labelled berth.dev/template=<template>; off always makes its pod directly")
	f.StringVar(&g.onNodeLost, "on-node-lost", "fail", "with --kubernetes: what happens to a sandbox whose node is lost when its create names no on_node_lost: fail (reported lost) or recreate (made again, same ID, on another node)")
	f.IntVar(&g.snapCopies, "snapshot-copies", 1, "with --kubernetes: how many Berth nodes hold each snapshot; above 1, the leader copies each to more Ready nodes, so a sandbox can be made from it, and one made from it made again, when its node is lost")
	f.StringVar(&g.e2bNetwork, "e2b-default-network", "open", "with --kubernetes: what E2B's allow_internet_access: true (the SDKs' default) gives a sandbox: open (egress to the internet) or none (no egress; as the daemon's e2b_default_network)")
	f.StringVar(&g.lifecycle.Identity, "leader-id", "", "with --kubernetes: this replica's name in the leader election (default hostname_pid); the leader clears ended sandboxes and acts on lost nodes")
}

// runGateway serves the native API for a cluster of Berth nodes. It
// needs no root, data dir or runtime: its state is the cluster's.
func runGateway(cmd *cobra.Command, o *serveOptions, g *gatewayOptions) error {
	if g.nodeCert == "" || g.nodeKey == "" || g.nodeCA == "" {
		return &errdefs.Error{Code: errdefs.CodeInvalidArgument, Field: "node-client-cert",
			Message: "berth serve --kubernetes needs --node-client-cert, --node-client-key and --node-ca (the data plane reaches the nodes' kubelet API port over mutual TLS)"}
	}
	if o.cfgFile != "" {
		return &errdefs.Error{Code: errdefs.CodeInvalidArgument, Field: "config",
			Message: "berth serve --kubernetes takes flags only; --config is the daemon's"}
	}
	if err := checkAPIRate(g.apiQPS, g.apiBurst); err != nil {
		return err
	}
	if g.lifecycle.KeepEnded < 0 {
		return &errdefs.Error{Code: errdefs.CodeInvalidArgument, Field: "keep-ended", Message: fmt.Sprintf("--keep-ended %s: want 0 (at once) or a positive duration", g.lifecycle.KeepEnded)}
	}
	if g.lifecycle.NodeLostAfter <= 0 {
		return &errdefs.Error{Code: errdefs.CodeInvalidArgument, Field: "node-lost-after", Message: fmt.Sprintf("--node-lost-after %s: want a positive duration", g.lifecycle.NodeLostAfter)}
	}
	if g.e2bNetwork != "open" && g.e2bNetwork != "none" {
		return &errdefs.Error{Code: errdefs.CodeInvalidArgument, Field: "e2b-default-network", Message: fmt.Sprintf("--e2b-default-network %q: want open or none", g.e2bNetwork)}
	}
	listen := o.flags.Listen
	if g.apiKeys == "" && !o.flags.InsecureNoAuth && !daemon.LoopbackOnly(listen) {
		return &errdefs.Error{Code: errdefs.CodeFailedPrecondition, Field: "api-keys",
			Message: fmt.Sprintf("--listen %s reaches beyond loopback and the gateway has no --api-keys: give it keys, or --insecure-no-auth to serve it unauthenticated anyway", listen)}
	}
	level := slog.LevelInfo
	if o.debug {
		level = slog.LevelDebug
	}
	out, _, closeLog, err := logOutput(o.flags.LogFile, 0, 0)
	if err != nil {
		return err
	}
	defer func() { _ = closeLog() }()
	log := slog.New(slog.NewTextHandler(out, &slog.HandlerOptions{Level: level}))

	var rc *rest.Config
	if g.kubeconfig != "" {
		rc, err = clientcmd.BuildConfigFromFlags("", g.kubeconfig)
	} else {
		rc, err = rest.InClusterConfig()
	}
	if err != nil {
		return fmt.Errorf("--kubeconfig: %w", err)
	}
	rc.QPS, rc.Burst = float32(g.apiQPS), g.apiBurst
	kube, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return fmt.Errorf("--kubeconfig: %w", err)
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return fmt.Errorf("--kubeconfig: %w", err)
	}
	tr, err := gateway.NodeTransport(g.nodeCert, g.nodeKey, g.nodeCA)
	if err != nil {
		return err
	}
	var keys auth.Verifier
	if g.apiKeys != "" {
		k, err := gateway.LoadKeys(g.apiKeys)
		if err != nil {
			return err
		}
		keys = k
	}
	gw, err := gateway.New(gateway.Config{
		Kube: kube, Dynamic: dyn, Claims: g.claims, Namespace: g.namespace, NodeTransport: tr, Keys: keys,
		DefaultTemplate: o.flags.DefaultTemplate, CreateTimeout: g.createTimeout, OnNodeLost: g.onNodeLost, SnapshotCopies: g.snapCopies,
		Domain: o.flags.E2BDomain, E2BNoInternet: g.e2bNetwork == "none",
		Version: buildVersion(), Logger: log,
	})
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, syscall.SIGINT)
	// The informers end with ctx: end it before waiting for them, also
	// when Serve failed on its own.
	defer func() {
		stop()
		gw.Shutdown()
	}()
	if err := gw.Run(ctx); err != nil {
		return err
	}
	// The leader election runs beside the API until ctx ends.
	lifeErr := make(chan error, 1)
	go func() { lifeErr <- gw.RunLifecycle(ctx, g.lifecycle) }()
	err = gw.Serve(ctx, listen)
	stop()
	return errors.Join(err, <-lifeErr)
}
