#!/usr/bin/env bash
# Installs what building and running Berth needs on Debian (bookworm or
# later): the OCI runtime, template builders, kernel tools; then fetches the
# Go modules. Idempotent; run as root.
set -euo pipefail
cd "$(dirname "$0")/.."

pkgs=(runc debootstrap busybox-static nftables iproute2 e2fsprogs util-linux ca-certificates curl git tmux netcat-openbsd)
missing=()
for p in "${pkgs[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
	echo "installing: ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
if ! command -v go >/dev/null; then
	if [ -x /usr/local/go/bin/go ]; then
		export PATH=$PATH:/usr/local/go/bin
	else
		echo "Go 1.26 or later is required (https://go.dev/doc/install)" >&2
		exit 1
	fi
fi
go mod download
