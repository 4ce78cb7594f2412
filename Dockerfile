# Vigil's image: the `vigil` binary with the shipped rules and the bundled sample.
FROM rust:1.85-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin vigil

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/vigil /usr/local/bin/vigil
COPY rules /rules
COPY samples /samples
ENV VIGIL_RULES=/rules VIGIL_HTTP_ADDR=0.0.0.0:8080 VIGIL_SPOOL_DIR=/var/lib/vigil/spool
EXPOSE 8080
ENTRYPOINT ["vigil"]
CMD ["serve"]
