#!/usr/bin/env bash
# Regenerates the Go code for the agent's protocol (process, filesystem).
# Everything runs through `go run` of pinned versions: buf at BUF_VERSION, the
# protoc plugins at the versions go.mod requires. Extra arguments go to
# `buf generate` (scripts/check-proto.sh passes -o DIR to generate elsewhere).
set -euo pipefail
BUF_VERSION=v1.50.0
cd "$(dirname "$0")"
go run "github.com/bufbuild/buf/cmd/buf@${BUF_VERSION}" generate "$@"
