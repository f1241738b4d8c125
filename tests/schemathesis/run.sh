#!/usr/bin/env bash
# Checks that the server keeps to the OpenAPI document it serves: schemathesis with every check,
# all phases (examples, coverage, fuzzing, stateful), a fixed seed and a bounded number of
# examples, against the release binary on SQLite and on PostgreSQL. Any failure fails the run.
#
#   tests/schemathesis/run.sh [BINARY]     (default target/release/kat-scheduler)
#
# Needs python3 with venv; the virtualenv is made in target/schemathesis-venv from
# requirements.txt. PostgreSQL: KAT_TEST_PG_URL (default postgresql://postgres@127.0.0.1:5432/postgres).
set -euo pipefail
cd "$(dirname "$0")/../.."
bin="${1:-target/release/kat-scheduler}"
venv=target/schemathesis-venv
seed="${SCHEMATHESIS_SEED:-1}"
examples="${SCHEMATHESIS_EXAMPLES:-100}"
pg_admin="${KAT_TEST_PG_URL:-postgresql://postgres@127.0.0.1:5432/postgres}"

if [ ! -x "$venv/bin/schemathesis" ] || ! cmp -s tests/schemathesis/requirements.txt "$venv/requirements.txt"; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r tests/schemathesis/requirements.txt
  cp tests/schemathesis/requirements.txt "$venv/requirements.txt"
fi

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

check() { # name, database uri
  local name="$1" uri="$2" port log pid
  port=$(free_port)
  log="target/schemathesis-$name.log"
  SCHEDULER_DB_URI="$uri" SCHEDULER_API_HOST=127.0.0.1 SCHEDULER_API_PORT="$port" \
    SCHEDULER_LOGGING_FORMAT=text "$bin" > "$log" 2>&1 &
  pid=$!
  for _ in $(seq 1 100); do
    curl -fsS "http://127.0.0.1:$port/livez" > /dev/null 2>&1 && break
    sleep 0.2
  done
  echo "schemathesis against $name (seed $seed, $examples examples per operation)"
  local status=0
  timeout 900 "$venv/bin/schemathesis" --config-file tests/schemathesis/schemathesis.toml run "http://127.0.0.1:$port/openapi.json" \
    --checks all --max-examples "$examples" --seed "$seed" --no-color || status=$?
  kill "$pid" 2> /dev/null || true
  wait "$pid" 2> /dev/null || true
  if [ "$status" -ne 0 ]; then
    echo "schemathesis found failures against $name (exit $status); server log: $log" >&2
    return "$status"
  fi
}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
check sqlite "sqlite://$work/contract.db"

db="kat_contract_$$"
base="${pg_admin%/*}"
psql "$pg_admin" -qc "CREATE DATABASE $db"
trap 'rm -rf "$work"; psql "$pg_admin" -qc "DROP DATABASE IF EXISTS $db WITH (FORCE)" > /dev/null 2>&1 || true' EXIT
check postgresql "$base/$db"
echo "schemathesis: no failures on SQLite and PostgreSQL"
