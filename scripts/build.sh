#!/usr/bin/env bash
# Builds berth and the static berth-agent into ./bin, stamping berth with
# its version (git describe) and commit; `berth version` prints them.
# BERTH_BIN_DIR builds elsewhere; BERTH_VERSION and BERTH_COMMIT override
# the stamps (a release build from a tarball without .git).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v go >/dev/null || export PATH=$PATH:/usr/local/go/bin
out=${BERTH_BIN_DIR:-bin}
mkdir -p "$out"
version=${BERTH_VERSION:-$(git describe --tags --always --dirty 2>/dev/null || echo devel)}
commit=${BERTH_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
if [ -n "$(git status --porcelain 2>/dev/null)" ] && [[ $commit != *-dirty ]] && [ -z "${BERTH_COMMIT:-}" ]; then
	commit=$commit-dirty
fi
go build -ldflags "-X main.version=$version -X main.commit=$commit" -o "$out/berth" ./cmd/berth
CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o "$out/berth-agent" ./cmd/berth-agent
