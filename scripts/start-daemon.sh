#!/usr/bin/env bash
# Starts the berth daemon installed in /usr/local/bin on its embedded
# defaults and waits until it answers on $BERTH_URL (default
# http://127.0.0.1:2378): the last step of scripts/install.sh. Where
# systemd runs, as the unit scripts/berth.service (restarted on failure,
# logging to the journal; checked by scripts/lint.sh, run under a real
# systemd by test/install); elsewhere (a container, CI) in the background
# with a log file the daemon rotates itself (100 MB, five old files kept).
# A daemon already answering is left as it is. Run as root.
set -euo pipefail
cd "$(dirname "$0")/.."
BERTH_URL=${BERTH_URL:-http://127.0.0.1:2378}
health() { curl -fsS "$BERTH_URL/v1/health" >/dev/null 2>&1; }

if health; then
	echo "berth daemon already running at $BERTH_URL ($(BERTH_URL=$BERTH_URL berth version | head -1))"
	exit 0
elif [ -d /run/systemd/system ]; then
	install -m 0644 scripts/berth.service /etc/systemd/system/berth.service
	systemctl daemon-reload
	systemctl enable --now berth
	how="by systemd (systemctl status berth; journalctl -u berth)"
else
	mkdir -p /var/log/berth
	nohup /usr/local/bin/berth serve --log-file /var/log/berth/berth.log >/dev/null 2>&1 &
	how="in the background (pid $!, also in /var/lib/berth/berth.pid), log in /var/log/berth/berth.log"
fi
for _ in $(seq 1 600); do
	if health; then
		echo "berth daemon started $how"
		exit 0
	fi
	sleep 0.1
done
echo "berth daemon started $how but does not answer on $BERTH_URL after 60 s" >&2
exit 1
