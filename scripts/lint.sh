#!/usr/bin/env bash
# Static checks: golangci-lint with .golangci.yml, then that the generated
# protocol code is up to date (scripts/check-proto.sh), then that the systemd
# unit install.sh installs is one systemd accepts. Part of
# scripts/test.sh, and so of CI.
#
# golangci-lint is built from source through the Go module proxy at a pinned
# version (no binary download) into
# ${BERTH_CACHE_DIR:-/var/cache/berth}/tools/golangci-lint-<version>/, once;
# the first build takes about 10 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v go >/dev/null || export PATH=$PATH:/usr/local/go/bin
GOLANGCI_LINT_VERSION=v2.15.0
dir=${BERTH_CACHE_DIR:-/var/cache/berth}/tools/golangci-lint-${GOLANGCI_LINT_VERSION}
if [ ! -x "$dir/golangci-lint" ]; then
	echo "building golangci-lint ${GOLANGCI_LINT_VERSION} into $dir"
	mkdir -p "$dir"
	GOBIN=$dir go install "github.com/golangci/golangci-lint/v2/cmd/golangci-lint@${GOLANGCI_LINT_VERSION}"
fi
"$dir/golangci-lint" run ./...
./scripts/check-proto.sh

# systemd-analyze verify warns (and still exits 0) for settings it cannot
# parse, so any output fails. ExecStart must name an existing binary: point it
# at the one scripts/build.sh made.
if command -v systemd-analyze >/dev/null && [ -x bin/berth ]; then
	unitdir=$(mktemp -d)
	trap 'rm -rf "$unitdir"' EXIT
	sed "s#/usr/local/bin/berth#$PWD/bin/berth#" scripts/berth.service >"$unitdir/berth.service"
	out=$(systemd-analyze verify "$unitdir/berth.service" 2>&1) || { echo "$out" >&2; exit 1; }
	if [ -n "$out" ]; then
		echo "scripts/berth.service: $out" >&2
		exit 1
	fi
fi
