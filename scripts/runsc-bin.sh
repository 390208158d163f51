#!/usr/bin/env bash
# Builds gVisor's runsc from source through the Go module proxy with the
# installed Go, at the version pinned below, and caches it under
# ${BERTH_CACHE_DIR:-/var/cache/berth}/runsc/<version>/runsc. Only the first
# run builds (a few minutes of CPU on 2 cores); a later run returns at once.
#
#   scripts/runsc-bin.sh          build if missing, print the binary's path
#   scripts/runsc-bin.sh --check  exit 0 if the binary is cached, else 1
#
# Why: Debian's runsc package is a 2022 build. gVisor publishes its Go
# source, generated files included, on its repository's "go" branch, which
# the module proxy serves as gvisor.dev/gvisor pseudo-versions; runsc built
# from one is current gVisor (the systrap platform, statx flags, checkpoint
# of sockets with waiters). The binary reports the pseudo-version as its
# version: "go-<YYYYMMDDhhmmss>-<commit>".
set -euo pipefail
trap 'echo "runsc-bin: failed at line $LINENO" >&2' ERR

GVISOR_VERSION=${BERTH_GVISOR_VERSION:-v0.0.0-20260701204157-69c2d17aea96}
cache=${BERTH_CACHE_DIR:-/var/cache/berth}/runsc
out=$cache/$GVISOR_VERSION

have() { [ -x "$out/runsc" ] && [ -f "$out/.complete" ]; }

if [ "${1:-}" = "--check" ]; then
	have && exit 0
	exit 1
fi
if have; then
	echo "$out/runsc"
	exit 0
fi

if ! command -v go >/dev/null; then
	if [ -x /usr/local/go/bin/go ]; then
		export PATH=$PATH:/usr/local/go/bin
	else
		echo "runsc-bin: Go is required" >&2
		exit 1
	fi
fi

mkdir -p "$cache"
# One build at a time: a second caller waits for the first, then finds it.
exec 9>"$cache/.build.lock"
flock 9
if have; then
	echo "$out/runsc"
	exit 0
fi

work=$(mktemp -d "$cache/.build.XXXXXX")
trap 'rm -rf "$work"' EXIT
cd "$work"
printf 'module berth.local/runscbin\n\ngo 1.24\n' >go.mod
printf '//go:build tools\n\npackage tools\n\nimport _ "gvisor.dev/gvisor/runsc"\n' >tools.go
# The pin decides every dependency's version too: gvisor's own go.mod
# requires what it was tested with, and `go get` takes exactly that.
GOFLAGS=-mod=mod go get "gvisor.dev/gvisor@$GVISOR_VERSION" >/dev/null 2>&1

# v0.0.0-20260701204157-69c2d17aea96 -> go-20260701204157-69c2d17aea96
stamp=go-${GVISOR_VERSION#v0.0.0-}
echo "runsc-bin: building runsc $stamp" >&2
CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath \
	-ldflags "-s -w -X gvisor.dev/gvisor/runsc/version.version=$stamp" \
	-o "$work/runsc" gvisor.dev/gvisor/runsc

# Captured, not piped into grep -q: under pipefail an early grep exit
# would fail the writer with SIGPIPE.
v=$("$work/runsc" --version)
[[ $v == *"runsc version $stamp"* ]] || { echo "runsc-bin: runsc says $v" >&2; exit 1; }
rm -rf "$out"
mkdir -p "$out"
mv "$work/runsc" "$out/runsc"
touch "$out/.complete"
echo "$out/runsc"
