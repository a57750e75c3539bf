# rate-tier-service, the drop-in for envoyproxy/ratelimit, as a container:
#
#   docker build -t rate-tier-service .
#   docker run --rm -p 8080:8080 -p 8081:8081 rate-tier-service
#   docker run --rm -v "$PWD/rules:/etc/rate-tier-service:ro" rate-tier-service
#
# It serves the rules in /etc/rate-tier-service (a YAML file or a directory of
# them, envoyproxy/ratelimit's format; the image holds examples/ratelimit
# there: mount your own over it, as the Kubernetes example in examples/k8s/
# does with a ConfigMap). Changed files are reloaded; an invalid one keeps the
# running rules. Arguments after the image name replace the default ones, for
# example `--config /etc/rate-tier-service --redis redis://redis:6379/
# --grpc 0.0.0.0:8081 --http 0.0.0.0:8080` (see `--help`).
#
# On a machine whose Docker engine cannot pull (no registry), `cargo xtask
# service-image` builds the same runtime (this file's EXPOSE, USER,
# ENTRYPOINT, CMD and HEALTHCHECK) FROM scratch from the locally built binary.

# --- builder ----------------------------------------------------------------
FROM rust:1-bookworm AS builder
WORKDIR /src
# The whole workspace (cargo needs every member's manifest); .dockerignore
# leaves out target/, .git and the fuzz corpora.
COPY . .
RUN cargo build --release --locked -p rate-tier-service \
    && cp target/release/rate-tier-service /usr/local/bin/rate-tier-service

# --- runtime ----------------------------------------------------------------
# The same Debian release as the builder: the binary needs its glibc (and
# libgcc_s), nothing else. No TLS is linked in (redis:// and postgres://
# without TLS), so no CA certificates are needed.
FROM debian:bookworm-slim
RUN groupadd --system --gid 10001 ratelimit \
    && useradd --system --uid 10001 --gid ratelimit --no-create-home \
        --home-dir /nonexistent --shell /usr/sbin/nologin ratelimit
COPY --from=builder /usr/local/bin/rate-tier-service /usr/local/bin/rate-tier-service
COPY examples/ratelimit/ /etc/rate-tier-service/
USER 10001:10001
# gRPC (ShouldRateLimit, grpc.health.v1) and HTTP (/json, /healthcheck,
# /metrics): the service's default ports, on every interface of the
# container (its own default is loopback only).
EXPOSE 8081 8080
ENTRYPOINT ["/usr/local/bin/rate-tier-service"]
CMD ["--config", "/etc/rate-tier-service", "--grpc", "0.0.0.0:8081", "--http", "0.0.0.0:8080"]
# The service has no health subcommand and a slim image has no curl: bash
# (in every Debian image) asks /healthcheck itself over /dev/tcp. It answers
# 200 while serving and 500 once a shutdown began. When CMD moves the HTTP
# listener off port 8080, change the port here too (or leave health to the
# orchestrator: the Kubernetes example's probes ask /healthcheck).
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
    CMD ["/bin/bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/8080 && printf 'GET /healthcheck HTTP/1.1\\r\\nHost: localhost\\r\\nConnection: close\\r\\n\\r\\n' >&3 && head -n 1 <&3 | grep -q ' 200 '"]
