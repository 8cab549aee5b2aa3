# syntax=docker/dockerfile:1
# The syncd image: a static binary on distroless, running as a non-root user.
#   docker build -t syncd .
#   docker run --rm -p 127.0.0.1:9090:9090 -e SYNCD_ADMIN_LISTEN=0.0.0.0:9090 syncd run --demo
# See docs/operations.md ("Container image") for a real deployment.

ARG GO_VERSION=1.26

FROM golang:${GO_VERSION} AS build
WORKDIR /src
# Modules first, so that a source change does not download them again.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# SQLite is modernc.org/sqlite (pure Go), so the binary needs no libc and
# runs on an image without one. -buildvcs=false: the build context carries
# no .git (see .dockerignore).
RUN CGO_ENABLED=0 go build -trimpath -buildvcs=false -ldflags="-s -w" -o /out/syncd ./cmd/syncd \
 && mkdir -p /out/state

# static: CA certificates, /etc/passwd with "nonroot" (65532) and tzdata;
# no shell, so [platform] token_command cannot be used here: mount the
# token as a file and set token_file.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/syncd /usr/local/bin/syncd
COPY --from=build --chown=65532:65532 /out/state /var/lib/syncd
# The mirror (and the embedded JetStream store beside it) lives on the volume.
ENV SYNCD_STORE_PATH=/var/lib/syncd/syncd.db
VOLUME /var/lib/syncd
WORKDIR /var/lib/syncd
USER nonroot:nonroot
# 9090: [admin] listen (metrics, health), 8080: a conventional [events] listen.
EXPOSE 9090 8080
ENTRYPOINT ["/usr/local/bin/syncd"]
CMD ["run", "--config", "/etc/syncd/syncd.toml"]
