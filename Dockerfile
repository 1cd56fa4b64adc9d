# syntax=docker/dockerfile:1
# aralez: a static musl binary in a minimal image, config in /etc/aralez.
#
#   docker build -t aralez .
#   docker run --rm -p 6193:6193 aralez          # sample config: file server demo on :6193
#   docker run --rm -p 80:6193 -v $PWD/myconf:/etc/aralez:ro aralez
#
# Reload routes: docker kill -s HUP <container>. Stop: docker stop (SIGTERM, drains up to
# grace_period_seconds; give `docker stop -t` at least that long).

# ---- build: Alpine's Rust targets x86_64/aarch64-unknown-linux-musl and links statically ----
FROM rust:1-alpine AS build
# musl-dev for the C parts (mimalloc), cmake/perl/clang for aws-lc-sys (rustls' crypto).
RUN apk add --no-cache musl-dev cmake perl clang make g++ linux-headers ca-certificates
WORKDIR /src
ENV RUSTFLAGS="-C target-feature=+crt-static"
# Dependencies first, so a source change does not rebuild them.
COPY Cargo.toml Cargo.lock build.rs ./
# h2 and rustls, patched (vendor/*/PATCHED.md), in place of the crates.io copies.
COPY vendor ./vendor
RUN mkdir src && echo 'fn main() {}' > src/main.rs && touch src/lib.rs \
    && cargo build --release --locked || true
COPY src ./src
RUN touch src/main.rs src/lib.rs \
    && cargo build --release --locked \
    && cp target/release/aralez /aralez \
    && ! ldd /aralez 2>/dev/null | grep -q '=>'   # fail if anything is linked dynamically
# Directories the runtime image needs (scratch has no shell to make them).
RUN mkdir -p /out/run/aralez /out/tmp && chmod 1777 /out/tmp && chown 65534:65534 /out/run/aralez

# ---- runtime: nothing but the binary, CA roots, and the config ----
FROM scratch
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=build /out/tmp /tmp
# nobody writes its pid file and upgrade socket here; --chown, as COPY makes everything root's.
COPY --from=build --chown=65534:65534 /out/run/aralez /run/aralez
COPY --from=build /aralez /usr/local/bin/aralez
COPY deploy/docker/main.yaml /etc/aralez/main.yaml
COPY config/upstreams.yaml /etc/aralez/upstreams.yaml
COPY config/conf.d /etc/aralez/conf.d
COPY config/www /etc/aralez/www
# nobody:nogroup; the sample listens on a high port, so no capability is needed.
USER 65534:65534
EXPOSE 6193
# `scratch` has no curl: the binary probes its own listener (any HTTP answer is healthy).
HEALTHCHECK --interval=30s --timeout=5s --start-period=10s --retries=3 \
    CMD ["/usr/local/bin/aralez", "healthcheck", "-c", "/etc/aralez/main.yaml", "--timeout", "4"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/aralez"]
CMD ["-c", "/etc/aralez/main.yaml"]
