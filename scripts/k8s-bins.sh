#!/usr/bin/env bash
# Builds the Kubernetes control plane that the Kubernetes tests (test/kube)
# run on loopback: kube-apiserver, kube-scheduler, kube-controller-manager
# (for its garbage collector) and etcd, from source through the Go module
# proxy with the installed Go, and agent-sandbox's controller with its CRDs
# (sigs.k8s.io/agent-sandbox: the SandboxClaim API the gateway can make
# sandboxes through). The binaries are cached under
# ${BERTH_CACHE_DIR:-/var/cache/berth}/k8s/<version>/, so only the first run
# builds (about 20 to 30 min of CPU on 2 cores); a later run returns at once,
# and one that finds some binary missing builds only that one.
#
#   scripts/k8s-bins.sh          build what is missing, print the directory
#   scripts/k8s-bins.sh --check  exit 0 if everything is cached, else 1
#
# k8s.io/kubernetes is not meant to be imported: its go.mod replaces every
# staging module (k8s.io/api, k8s.io/client-go, ...) with a directory inside
# its own tree. A module that requires it must therefore pin each staging
# module to the matching published version (v0.X.Y for v1.X.Y), which is
# what the go.mod written below does.
set -euo pipefail
trap 'echo "k8s-bins: failed at line $LINENO" >&2' ERR

K8S_VERSION=${BERTH_K8S_VERSION:-v1.34.4}
# etcd: the version Kubernetes itself pins in its go.mod for this release.
ETCD_VERSION=${BERTH_ETCD_VERSION:-v3.6.4}
AGENT_SANDBOX_VERSION=${BERTH_AGENT_SANDBOX_VERSION:-v1.0.1}
cache=${BERTH_CACHE_DIR:-/var/cache/berth}/k8s
out=$cache/$K8S_VERSION-etcd$ETCD_VERSION
kbins=(kube-apiserver kube-scheduler kube-controller-manager)

# missing prints what is not built yet: each Kubernetes binary, etcd, and
# agent-sandbox (its controller, CRDs and version stamp).
missing() {
	for b in "${kbins[@]}" etcd; do
		[ -x "$out/$b" ] || echo "$b"
	done
	if [ ! -x "$out/agent-sandbox-controller" ] ||
		[ "$(cat "$out/agent-sandbox.version" 2>/dev/null)" != "$AGENT_SANDBOX_VERSION" ] ||
		! ls "$out"/agent-sandbox-crds/*.yaml >/dev/null 2>&1; then
		echo agent-sandbox
	fi
}
have() { [ -z "$(missing)" ]; }

if [ "${1:-}" = "--check" ]; then
	have && exit 0
	exit 1
fi
if have; then
	echo "$out"
	exit 0
fi

if ! command -v go >/dev/null; then
	if [ -x /usr/local/go/bin/go ]; then
		export PATH=$PATH:/usr/local/go/bin
	else
		echo "k8s-bins: Go is required" >&2
		exit 1
	fi
fi

mkdir -p "$cache"
# One build at a time: a second caller waits for the first and then finds
# the binaries.
exec 9>"$cache/.build.lock"
flock 9
if have; then
	echo "$out"
	exit 0
fi

todo=$(missing)
need() { grep -qx "$1" <<<"$todo"; }
work=$(mktemp -d "$cache/.build.XXXXXX")
trap 'rm -rf "$work"' EXIT
cd "$work"
mkdir -p "$work/bin" "$out"

if need agent-sandbox; then
	# Its own module, built with the versions agent-sandbox pins (go
	# install pkg@version reads its go.mod, not Berth's or this one's).
	echo "k8s-bins: building agent-sandbox-controller $AGENT_SANDBOX_VERSION" >&2
	CGO_ENABLED=0 GOBIN=$work/bin GOFLAGS= go install -trimpath -ldflags "-s -w" \
		"sigs.k8s.io/agent-sandbox/cmd/agent-sandbox-controller@$AGENT_SANDBOX_VERSION"
	asdir=$(GOFLAGS= go mod download -json "sigs.k8s.io/agent-sandbox@$AGENT_SANDBOX_VERSION" |
		sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
	mkdir "$work/crds"
	cp "$asdir"/k8s/crds/*.yaml "$work/crds/"
	chmod 0644 "$work"/crds/*.yaml
	rm -rf "$out/agent-sandbox-crds"
	mv "$work/crds" "$out/agent-sandbox-crds"
	mv "$work/bin/agent-sandbox-controller" "$out/"
	echo "$AGENT_SANDBOX_VERSION" >"$out/agent-sandbox.version"
fi
if have; then
	echo "$out"
	exit 0
fi

staging=${K8S_VERSION/#v1./v0.}
cat >go.mod <<EOF
module berth.local/k8sbins

go 1.24
EOF
# The staging module list comes from Kubernetes' own go.mod, so a new
# release that adds one still builds.
GOFLAGS=-mod=mod go mod download -json "k8s.io/kubernetes@$K8S_VERSION" >dl.json
kmod=$(sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p' dl.json)
mods=$(sed -n 's#^[[:space:]]*\(k8s\.io/[a-z0-9-]*\) => \./staging/.*#\1#p' "$kmod")
if [ -z "$mods" ]; then
	echo "k8s-bins: no staging modules found in $kmod" >&2
	exit 1
fi
{
	echo "require k8s.io/kubernetes $K8S_VERSION"
	echo "require go.etcd.io/etcd/server/v3 $ETCD_VERSION"
	for m in $mods; do
		echo "replace $m => $m $staging"
	done
} >>go.mod
cat >tools.go <<'EOF'
//go:build tools

package tools

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
)
EOF
GOFLAGS=-mod=mod go mod tidy -e >/dev/null 2>&1 || true
GOFLAGS=-mod=mod go get "k8s.io/kubernetes@$K8S_VERSION" "go.etcd.io/etcd/server/v3@$ETCD_VERSION"

ver=k8s.io/component-base/version
commit=$(date -u +%Y-%m-%dT%H:%M:%SZ)
ldflags="-s -w -X $ver.gitVersion=$K8S_VERSION -X $ver.gitMajor=1 -X $ver.gitMinor=$(echo "$K8S_VERSION" | cut -d. -f2) -X $ver.gitTreeState=clean -X $ver.buildDate=$commit"
for c in "${kbins[@]}"; do
	need "$c" || continue
	echo "k8s-bins: building $c $K8S_VERSION" >&2
	CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags "$ldflags" -o "$work/bin/$c" "k8s.io/kubernetes/cmd/$c"
	# Captured, not piped into grep -q: under pipefail an early grep
	# exit would fail the writer with SIGPIPE.
	v=$("$work/bin/$c" --version)
	[[ $v == *"$K8S_VERSION"* ]] || { echo "k8s-bins: $c says $v" >&2; exit 1; }
done
if need etcd; then
	echo "k8s-bins: building etcd $ETCD_VERSION" >&2
	CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags "-s -w" -o "$work/bin/etcd" go.etcd.io/etcd/server/v3
	v=$("$work/bin/etcd" --version)
	[[ $v == *"${ETCD_VERSION#v}"* ]] || { echo "k8s-bins: etcd says $v" >&2; exit 1; }
fi
# Each binary lands whole: a rename within one file system.
mv "$work/bin/"* "$out/"
echo "$out"
