#!/usr/bin/env bash
# Installs what building and running Berth needs on Debian (bookworm or
# later): the OCI runtime, template builders, kernel tools; then fetches the
# Go modules. Idempotent; run as root.
set -euo pipefail
cd "$(dirname "$0")/.."

pkgs=(runc debootstrap busybox-static nftables iproute2 e2fsprogs util-linux ca-certificates curl git tmux netcat-openbsd)
# gVisor runtime (isolation: gvisor; internal/runtime/runsc). A newer runsc
# earlier on PATH is preferred at run time.
pkgs+=(runsc)
# Image-template tests (test/e2e image_test.go): a registry on loopback,
# images built with umoci and pushed with skopeo.
pkgs+=(docker-registry umoci skopeo)
# Registry credential tests (test/e2e registry_auth_test.go): htpasswd makes
# the bcrypt password file of a registry with auth.
pkgs+=(apache2-utils)
# Preview hosts (sandbox.getHost(port) = PORT-ID.berth.localhost): nss's
# myhostname module resolves every *.localhost name to 127.0.0.1 and ::1
# for getaddrinfo (Node, Python, curl); its install adds it to the hosts
# line of /etc/nsswitch.conf.
pkgs+=(libnss-myhostname)
# The systemd unit test (test/install): the daemon as scripts/install.sh
# starts it where systemd runs, under a systemd booted with systemd-nspawn.
pkgs+=(systemd-container)
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

# The E2B compatibility suite (test/e2b) runs the official npm e2b SDK,
# pinned by its package-lock.json.
if command -v npm >/dev/null && command -v node >/dev/null; then
	(cd test/e2b && npm ci --no-audit --no-fund --loglevel=error)
else
	echo "node/npm not found: skipping npm ci in test/e2b (the E2B SDK tests will be skipped)" >&2
fi
