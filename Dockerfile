# syntax=docker/dockerfile:1.7
# Build: docker build -t kat-scheduler .
# Run:   docker run -p 8004:8000 -e SCHEDULER_DB_URI=postgresql://postgres:postgres@db/kat_scheduler kat-scheduler
FROM rust:1.95-bookworm AS build
RUN apt-get update && apt-get install -y --no-install-recommends libpq-dev pkg-config \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY Cargo.toml Cargo.lock build.rs ./
COPY src ./src
COPY migrations ./migrations
# The manifest names the test and bench targets; cargo refuses it when their files are missing.
COPY tests ./tests
COPY benches ./benches
RUN cargo build --release --locked --bin kat-scheduler

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends libpq5 ca-certificates curl \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --home /var/lib/kat-scheduler --create-home kat
COPY --from=build /src/target/release/kat-scheduler /usr/local/bin/kat-scheduler
USER kat
WORKDIR /var/lib/kat-scheduler
VOLUME ["/var/lib/kat-scheduler"]
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s \
    CMD curl -fsS "http://127.0.0.1:${SCHEDULER_API_PORT:-8000}/health" || exit 1
# The service listens on 0.0.0.0:8000 by default; no ENV sets it here, since the environment wins
# over a --config file and would hide the file's [api] settings. (A file that sets another port
# wants SCHEDULER_API_PORT set as well, or the health check above asks the wrong port.)
#
# The database: without SCHEDULER_DB_URI, mula's older SCHEDULER_DB_DSN, or a --config file that
# names one ([database] uri), the service keeps an SQLite file in the volume. Chosen here rather
# than by ENV: an ENV SCHEDULER_DB_URI would win over a deployment's SCHEDULER_DB_DSN (the newer
# name wins) and over the file's uri, and the service would start on an empty file instead of
# its PostgreSQL.
COPY --chmod=755 <<'EOF' /usr/local/bin/kat-scheduler-entrypoint
#!/bin/sh
file=
prev=
for arg in "$@"; do
    case "$arg" in --config=*) file=${arg#--config=} ;; esac
    [ "$prev" = --config ] && file=$arg
    prev=$arg
done
names_database() {
    [ -n "$1" ] && [ -r "$1" ] && awk '
        /^[[:space:]]*\[/ { section = $0; sub(/#.*/, "", section); gsub(/[[:space:]"]/, "", section) }
        section == "[database]" && /^[[:space:]]*"?uri"?[[:space:]]*=/ { found = 1 }
        section == "" && /^[[:space:]]*"?database"?[[:space:]]*(\.[[:space:]]*"?uri"?[[:space:]]*=|=.*uri)/ { found = 1 }
        END { exit !found }' "$1"
}
if [ -z "$SCHEDULER_DB_URI" ] && [ -z "$SCHEDULER_DB_DSN" ] && ! names_database "$file"; then
    export SCHEDULER_DB_URI=sqlite:///var/lib/kat-scheduler/scheduler.db
fi
exec kat-scheduler "$@"
EOF
ENTRYPOINT ["/usr/local/bin/kat-scheduler-entrypoint"]
CMD ["serve"]
