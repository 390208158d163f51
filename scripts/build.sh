#!/usr/bin/env bash
# Builds berth and the static berth-agent into ./bin.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v go >/dev/null || export PATH=$PATH:/usr/local/go/bin
mkdir -p bin
go build -o bin/berth ./cmd/berth
CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o bin/berth-agent ./cmd/berth-agent
