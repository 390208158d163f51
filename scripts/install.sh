#!/usr/bin/env bash
# One command from a fresh Debian host to a command running in a sandbox:
# installs dependencies, builds and installs berth, berth-agent and a
# current runsc into /usr/local/bin, starts the daemon on its embedded
# defaults (a systemd unit where systemd runs, otherwise in the background
# with its rotated log in /var/log/berth/berth.log), builds the templates
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

if curl -fsS "$BERTH_URL/v1/health" >/dev/null 2>&1; then
	echo "berth daemon already running at $BERTH_URL ($(berth version | head -1))"
elif [ -d /run/systemd/system ]; then
	# systemd runs here: scripts/berth.service (restarted on failure,
	# logging to the journal; checked by scripts/lint.sh).
	install -m 0644 scripts/berth.service /etc/systemd/system/berth.service
	systemctl daemon-reload
	systemctl enable --now berth
	echo "berth daemon started by systemd (systemctl status berth; journalctl -u berth)"
else
	# No systemd (a container, CI): in the background, logging to a file
	# the daemon rotates itself (100 MB, five old files kept).
	mkdir -p /var/log/berth
	nohup /usr/local/bin/berth serve --log-file /var/log/berth/berth.log >/dev/null 2>&1 &
	echo "berth daemon started (pid $!, also in /var/lib/berth/berth.pid), log in /var/log/berth/berth.log"
fi
for _ in $(seq 1 300); do
	curl -fsS "$BERTH_URL/v1/health" >/dev/null 2>&1 && break
	sleep 0.1
done
berth template build minimal
berth template build base
id=$(berth create --template base)
echo "sandbox $id:"
berth exec "$id" -- uname -a
berth exec "$id" -- python3 -c 'print("hello from a Berth sandbox")'
echo "try: berth shell $id    (and berth kill $id when done)"
