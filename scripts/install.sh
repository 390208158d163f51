#!/usr/bin/env bash
# One command from a fresh Debian host to a command running in a sandbox:
# installs dependencies, builds and installs berth and berth-agent into
# /usr/local/bin, starts the daemon on its embedded defaults (systemd when
# it runs, otherwise in the background with its log in /var/log/berth.log),
# builds the templates and runs `uname -a` in a fresh sandbox. Run as root.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
./scripts/build.sh
install -m 0755 bin/berth /usr/local/bin/berth
install -m 0755 bin/berth-agent /usr/local/bin/berth-agent
export BERTH_URL=${BERTH_URL:-http://127.0.0.1:2378}

if berth version >/dev/null 2>&1 && curl -fsS "$BERTH_URL/v1/health" >/dev/null 2>&1; then
	echo "berth daemon already running at $BERTH_URL"
elif [ "$(systemctl is-system-running 2>/dev/null || true)" = running ] || [ "$(systemctl is-system-running 2>/dev/null || true)" = degraded ]; then
	cat > /etc/systemd/system/berth.service <<'UNIT'
[Unit]
Description=Berth sandbox daemon
After=network.target

[Service]
ExecStart=/usr/local/bin/berth serve
KillMode=process
Restart=on-failure

[Install]
WantedBy=multi-user.target
UNIT
	systemctl daemon-reload
	systemctl enable --now berth
else
	nohup /usr/local/bin/berth serve >>/var/log/berth.log 2>&1 &
	echo "berth daemon started (pid $!), log in /var/log/berth.log"
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
