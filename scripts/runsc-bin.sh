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
#
# The build carries precompiled seccomp filters, as gVisor's own Bazel
# build does: without them every sentry start (each create, restore and
# resume) compiles its host filter from scratch, which takes seconds on a
# loaded host. scripts/seccompgen.go, run against the pinned source, prints
# the programs of the configurations Berth runs (each platform, no GPU or
# TPU proxy); they are written into a vendored copy of runsc's boot/filter
# package before the build. A configuration without a program still
# works: the sentry compiles it, as before.
#
# The build also carries Berth's patches to gVisor, scripts/runsc-patches/
# (applied to the vendored source; one that no longer applies fails the
# build). page-load-after-decode.patch: on a restore, the sentry keeps one
# read of the memory image's pages in flight while it decodes the kernel
# state, then eight, instead of 128 from the start; the reads of pages
# something waits for are not bounded. seccomp-cache-by-filter.patch: a
# task's cache of its seccomp filters' answers (one per system call
# number) is taken from a task with the same filters instead of computed
# again, which a restore did for every task and a clone does for every
# new thread. Both measured in the README (Performance, "The page loader
# and the decode", "The seccomp cache").
set -euo pipefail
trap 'echo "runsc-bin: failed at line $LINENO" >&2' ERR

scripts=$(cd "$(dirname "$0")" && pwd)
GVISOR_VERSION=${BERTH_GVISOR_VERSION:-v0.0.0-20260701204157-69c2d17aea96}
cache=${BERTH_CACHE_DIR:-/var/cache/berth}/runsc
# The directory names the recipe too, so a changed recipe builds afresh:
# "berth" (precompiled filters and patches) and a digest of the patches.
patches=$(cat "$scripts"/runsc-patches/*.patch | sha256sum | cut -c1-8)
out=$cache/$GVISOR_VERSION-berth-$patches

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

go mod tidy >/dev/null 2>&1
go mod vendor

# Berth's patches, each against the pinned gVisor's tree. git finds no
# repository above $work (the ceiling), so paths are the vendored tree's.
# (The module cache's files are read-only; the filter package below is
# rewritten too.)
chmod -R u+w vendor/gvisor.dev/gvisor
for p in "$scripts"/runsc-patches/*.patch; do
	GIT_CEILING_DIRECTORIES=$work git -C vendor/gvisor.dev/gvisor apply -p1 "$p"
done

# The generator (scripts/seccompgen.go) runs in this module, against the
# pinned gVisor.
cp "$scripts/seccompgen.go" seccompgen.go
CGO_ENABLED=0 go run -mod=vendor seccompgen.go >"$work/programs.txt"
lib=vendor/gvisor.dev/gvisor/runsc/boot/filter/filter_precompiled.go
# The module's file registers no program and says precompilation was
# disabled at build time; both lines must be where they were.
awk -v programs="$work/programs.txt" '
/^const PrecompilationDisabledAtBuildTime = true$/ { print "const PrecompilationDisabledAtBuildTime = false"; c++; next }
{ print }
/^\tprograms := make\(map\[string\]precompiledseccomp\.Program\)$/ { while ((getline l < programs) > 0) print l; r++ }
END { if (c != 1 || r != 1) { print "runsc-bin: unexpected layout of filter_precompiled.go" > "/dev/stderr"; exit 1 } }
' "$lib" >"$lib.new"
mv "$lib.new" "$lib"

# v0.0.0-20260701204157-69c2d17aea96 -> go-20260701204157-69c2d17aea96
stamp=go-${GVISOR_VERSION#v0.0.0-}
echo "runsc-bin: building runsc $stamp with precompiled seccomp filters" >&2
CGO_ENABLED=0 go build -mod=vendor -trimpath \
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
