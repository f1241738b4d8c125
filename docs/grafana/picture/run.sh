#!/bin/bash
# Draws docs/grafana/kat-scheduler.png: two instances of the release binary on one PostgreSQL
# database (`katdash`) and a RabbitMQ vhost (`katdash`), a stand-in Octopoes, Prometheus scraping
# both instances, 13 minutes of the load in load.py, the first instance killed with SIGKILL
# after 6 minutes and the second stopped cleanly 3 minutes later; then every panel's queries are
# asked of Prometheus over the run (fetch_data.py) and the dashboard is drawn with Grafana's own
# front-end packages (web/) in a headless Chromium. Run from the repository's root after
# `cargo build --release`; needs prometheus and chromium (Debian), python3 with pika and
# requests, and npm (see README.md here).
set -eu
HERE=docs/grafana/picture
WORK=${WORK:-target/dashboard-picture}
BIN=target/release/kat-scheduler
mkdir -p "$WORK"
cp -r $HERE/web "$WORK/"
(cd "$WORK/web" && npm ci --no-audit --no-fund >/dev/null)
dropdb -h 127.0.0.1 -U postgres --if-exists katdash; createdb -h 127.0.0.1 -U postgres katdash
rabbitmqctl delete_vhost katdash >/dev/null 2>&1 || true
rabbitmqctl add_vhost katdash >/dev/null; rabbitmqctl set_permissions -p katdash guest ".*" ".*" ".*" >/dev/null
python3 $HERE/octopoes.py 18090 & OCTOPOES=$!
rm -rf "$WORK/prom-data"
prometheus --config.file=$HERE/prometheus.yml --storage.tsdb.path="$WORK/prom-data" \
  --web.listen-address=127.0.0.1:19090 > "$WORK/prometheus.log" 2>&1 & PROMETHEUS=$!
start() { # instance port
  QUEUE_URI=amqp://guest:guest@127.0.0.1:5672/katdash SCHEDULER_INSTANCE_ID=$1 SCHEDULER_API_PORT=$2 \
    $BIN --config $HERE/config.toml >> "$WORK/$1.log" 2>&1 &
  echo $! > "$WORK/$1.pid"
}
python3 $HERE/load.py --declare
start kat-a 18081; sleep 4; start kat-b 18082; sleep 3
T0=$(date -u +%s)
python3 $HERE/load.py http://127.0.0.1:18081,http://127.0.0.1:18082 780 > "$WORK/load.log" 2>&1 &
sleep 360; kill -9 "$(cat "$WORK/kat-a.pid")"; sleep 3; start kat-a 18081
sleep 180; kill -TERM "$(cat "$WORK/kat-b.pid")"; sleep 5; start kat-b 18082
sleep 250; T1=$(date -u +%s)
mkdir -p "$WORK/web/dist"
python3 $HERE/fetch_data.py docs/grafana/kat-scheduler.json http://127.0.0.1:19090 $((T0 + 30)) "$T1" 2 \
  "$WORK/web/dist/data.js"
"$WORK/web/build.sh"
(cd "$WORK/web/dist" && exec python3 -m http.server 18199 --bind 127.0.0.1 >/dev/null 2>&1) & HTTP=$!
sleep 1
node "$WORK/web/shoot.mjs" http://127.0.0.1:18199/index.html "$WORK" 1600
cp "$WORK/dashboard.png" docs/grafana/kat-scheduler.png
kill $HTTP
kill "$(cat "$WORK/kat-a.pid")" "$(cat "$WORK/kat-b.pid")"; sleep 3; kill $PROMETHEUS $OCTOPOES
dropdb -h 127.0.0.1 -U postgres katdash; rabbitmqctl delete_vhost katdash >/dev/null
