# rate-tier-service, the drop-in for envoyproxy/ratelimit, as a container:
#
#   docker build -t rate-tier-service .
#   docker run --rm -p 8080:8080 -p 8081:8081 -p 6070:6070 rate-tier-service
#   docker run --rm -e RUNTIME_ROOT=/data -e RUNTIME_SUBDIRECTORY=ratelimit \
#       -v "$PWD/rules:/data/ratelimit/config:ro" \
#       -e REDIS_SOCKET_TYPE=tcp -e REDIS_URL=redis:6379 rate-tier-service
#
# Configured as envoyproxy/ratelimit is, by its environment variables (see
# `--help` and the service's README): the rules are the YAML files in
# RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY, by default
# /srv/runtime_data/current/config, where the image holds examples/ratelimit
# (mount your own over it, as the Kubernetes example in examples/k8s/ does
# with a ConfigMap). Changed files are reloaded; an invalid one keeps the
# running rules. Flags after the image name win over the environment.
#
# On a machine whose Docker engine cannot pull (no registry), `cargo xtask
# service-image` builds the same runtime (this file's ENV, EXPOSE, USER,
# ENTRYPOINT and HEALTHCHECK) FROM scratch from the locally built binary.

# --- builder ----------------------------------------------------------------
FROM rust:1-bookworm AS builder
WORKDIR /src
# The whole workspace (cargo needs every member's manifest); .dockerignore
# leaves out target/, .git and the fuzz corpora.
COPY . .
RUN cargo build --profile dist --locked -p rate-tier-service \
    && cp target/dist/rate-tier-service /usr/local/bin/rate-tier-service

# --- runtime ----------------------------------------------------------------
# The same Debian release as the builder: the binary needs its glibc (and
# libgcc_s), nothing else. TLS to Redis (rediss://) is rustls with the
# public roots built in (or the CA file of REDIS_TLS_CACERT), so the image
# needs no system CA certificates.
FROM debian:bookworm-slim
RUN groupadd --system --gid 10001 ratelimit \
    && useradd --system --uid 10001 --gid ratelimit --no-create-home \
        --home-dir /nonexistent --shell /usr/sbin/nologin ratelimit
COPY --from=builder /usr/local/bin/rate-tier-service /usr/local/bin/rate-tier-service
COPY examples/ratelimit/ /srv/runtime_data/current/config/
USER 10001:10001
# Every interface of the container, as envoyproxy/ratelimit binds (the
# binary's own default is loopback only).
ENV HOST=0.0.0.0 GRPC_HOST=0.0.0.0 DEBUG_HOST=0.0.0.0
# gRPC (ShouldRateLimit, grpc.health.v1), HTTP (/json, /healthcheck,
# /metrics) and debug (/rlconfig): envoyproxy/ratelimit's default ports.
EXPOSE 8081 8080 6070
ENTRYPOINT ["/usr/local/bin/rate-tier-service"]
# SIGTERM: health says not serving at once, requests are answered for
# DRAIN_PERIOD (5 s), then the listeners close.
# The service has no health subcommand and a slim image has no curl: bash
# (in every Debian image) asks /healthcheck itself over /dev/tcp. It answers
# 200 while serving and 503 once a drain began. When PORT moves the HTTP
# listener off 8080, change the port here too (or leave health to the
# orchestrator: the Kubernetes example's probes ask /healthcheck).
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
    CMD ["/bin/bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/8080 && printf 'GET /healthcheck HTTP/1.1\\r\\nHost: localhost\\r\\nConnection: close\\r\\n\\r\\n' >&3 && head -n 1 <&3 | grep -q ' 200 '"]
