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
# over a --config file and would hide the file's [api] settings.
# With neither SCHEDULER_DB_URI nor mula's older SCHEDULER_DB_DSN set, and no --config file, the
# service keeps an SQLite file in the volume. Set here rather than by ENV: an ENV SCHEDULER_DB_URI
# would win over a deployment's SCHEDULER_DB_DSN (the newer name wins) and over a --config file's
# [database] uri, and the service would start on an empty file instead of its PostgreSQL. (With a
# --config file that names no database, the file is data/scheduler.db in the volume.)
ENTRYPOINT ["/bin/sh", "-c", "case \" $* \" in *' --config'*) ;; *) SCHEDULER_DB_URI=\"${SCHEDULER_DB_URI:-${SCHEDULER_DB_DSN:-sqlite:///var/lib/kat-scheduler/scheduler.db}}\"; export SCHEDULER_DB_URI ;; esac; exec kat-scheduler \"$@\"", "kat-scheduler"]
CMD ["serve"]
