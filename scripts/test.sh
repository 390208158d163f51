#!/usr/bin/env bash
# The test command: installs dependencies, builds, and runs every test
# (unit, conformance, end-to-end against a real daemon). Run as root.
#
# The debootstrap base used by the `base` template is cached in
# ${BERTH_CACHE_DIR:-/var/cache/berth}; the first run builds it (~15 min),
# as it does the Kubernetes control plane the test/kube suite runs (k8s/)
# and a current runsc (runsc/).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
./scripts/build.sh
# The Kubernetes tests (test/kube) run kube-apiserver, kube-scheduler and
# etcd built from source once into ${BERTH_CACHE_DIR}/k8s (tens of minutes
# of CPU cold; instant once cached).
BERTH_CACHE_DIR=${BERTH_CACHE_DIR:-/var/cache/berth} ./scripts/k8s-bins.sh >/dev/null
command -v go >/dev/null || export PATH=$PATH:/usr/local/go/bin
export BERTH_CACHE_DIR=${BERTH_CACHE_DIR:-/var/cache/berth}
export BERTH_TEST_BASE=${BERTH_TEST_BASE:-1}
# gVisor: the suites run on a current runsc, built from gVisor's Go source
# once into ${BERTH_CACHE_DIR}/runsc (scripts/runsc-bin.sh; a few minutes
# of CPU cold) and found first on PATH. Debian's runsc (scripts/deps.sh)
# stays installed: internal/runtime/runsc runs its conformance suite too.
runsc_bin=$(./scripts/runsc-bin.sh)
export PATH=$(dirname "$runsc_bin"):$PATH
go vet ./...
# golangci-lint (.golangci.yml) and generated code up to date.
./scripts/lint.sh
# The CLI and the SDK are clients that also run on a laptop.
GOOS=darwin go build -o /dev/null ./client ./cmd/berth
# Two streams of packages, one package at a time in each: the end-to-end
# suite (test/e2e, about 20 minutes, the longest by far) from the start,
# and every other package one after the other beside it. Daemons side by
# side is what Berth supports: each suite's daemons have instance names of
# their own, which name their nftables tables, links, netns, cgroup
# parents and data dirs, and the harness's leak checks look only at their
# own instance; uid ranges are claimed host-wide (O_EXCL files), and the
# test net is one at a time across processes (/run/berth-testnet.lock).
# -timeout bounds each package's run: generous, because the suite must
# pass on a loaded host too (test/e2e takes ~20 min, far more next to a
# CPU hog).
e2e=github.com/berth-sandbox/berth/test/e2e
go test -p 1 -count=1 -timeout 60m "$@" "$e2e" &
e2e_pid=$!
rc=0
go test -p 1 -count=1 -timeout 60m "$@" $(go list ./... | grep -vx "$e2e") || rc=$?
wait "$e2e_pid" || rc=$?
exit "$rc"
