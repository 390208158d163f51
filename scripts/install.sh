#!/usr/bin/env bash
# One command from a fresh Debian host to a command running in a sandbox:
# installs dependencies, builds and installs berth, berth-agent and a
# current runsc into /usr/local/bin, starts the daemon on its embedded
# defaults (scripts/start-daemon.sh: a systemd unit where systemd runs,
# otherwise in the background with its rotated log in
# /var/log/berth/berth.log), builds the templates
# and runs `uname -a` in a fresh sandbox. Run as root.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
./scripts/build.sh
install -m 0755 bin/berth /usr/local/bin/berth
install -m 0755 bin/berth-agent /usr/local/bin/berth-agent
# The gvisor isolation level runs on a current runsc built from gVisor's Go
# source (cached in /var/cache/berth/runsc; a few minutes of CPU the first
# time), installed ahead of Debian's on PATH, as the tests run it. A runsc
# the operator put in /usr/local/bin themselves is left alone.
runsc_bin=$(BERTH_CACHE_DIR=${BERTH_CACHE_DIR:-/var/cache/berth} ./scripts/runsc-bin.sh)
if [ ! -e /usr/local/bin/runsc ] || /usr/local/bin/runsc --version 2>/dev/null | grep -q '^runsc version go-'; then
	install -m 0755 "$runsc_bin" /usr/local/bin/runsc
else
	echo "keeping /usr/local/bin/runsc ($(/usr/local/bin/runsc --version | head -1)); a current one is $runsc_bin"
fi
export BERTH_URL=${BERTH_URL:-http://127.0.0.1:2378}
./scripts/start-daemon.sh
berth template build minimal
berth template build base
id=$(berth create --template base)
echo "sandbox $id:"
berth exec "$id" -- uname -a
berth exec "$id" -- python3 -c 'print("hello from a Berth sandbox")'
echo "try: berth shell $id    (and berth kill $id when done)"
