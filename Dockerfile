# syntax=docker/dockerfile:1
# Build: docker build -t checkins:local .   Run: docker run -e REDIS_URL=redis://host:6379/0 checkins:local api

FROM golang:1.26 AS build
# go.mod's toolchain, with the standard library's security fixes: the go command fetches it from
# the Go module proxy (the image's own Go 1.26 starts it). The image sets GOTOOLCHAIN=local, which
# would ignore go.mod's toolchain line.
ENV GOTOOLCHAIN=go1.27.3
WORKDIR /src
# No `go mod download`: go.mod also lists the task tool's many dependencies, which the binary does
# not need. go build fetches only what it imports; the cache mounts keep modules and build cache
# across builds.
COPY . .
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/checkins ./cmd/checkins && mkdir -p /out/state

# Static binary: distroless has CA certificates (for rediss://) and a nonroot user, and no shell.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/checkins /usr/local/bin/checkins
# Dev mode's key lives in STATE_DIR; a volume mounted here starts owned by the nonroot user.
COPY --from=build --chown=65532:65532 /out/state /state
USER nonroot:nonroot
EXPOSE 8080 8081
ENV HTTP_ADDR=:8080 OPS_ADDR=:8081 STATE_DIR=/state
ENTRYPOINT ["/usr/local/bin/checkins"]
CMD ["serve"]
