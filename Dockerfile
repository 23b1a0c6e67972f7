# volcano-runner container image: a release build in the Rust image, then only the binary on a minimal
# non-root base (distroless "cc": glibc, libgcc, CA certificates, no shell, no package manager).
#
#   docker build -t volcano-runner:0.1.0 .
#
# Nothing else is needed at build time: protoc comes with the protoc-bin-vendored crate, and TLS is rustls.

# The toolchain the test suite runs with (Cargo.toml rust-version is the oldest that builds it).
FROM docker.io/library/rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin volcano-runner

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/volcano-runner /usr/local/bin/volcano-runner
# The distroless `nonroot` user; the Deployment runs as this uid too (runAsUser: 65532).
USER 65532:65532
# /metrics, /healthz and /readyz ([ops] listen).
EXPOSE 9090
ENTRYPOINT ["/usr/local/bin/volcano-runner"]
CMD ["run"]
