# sluice in a container: built with the Go image, run on distroless as a non-root user.
#
#   docker build -t sluice .
#   docker run --rm -p 8080:8080 -p 9901:9901 -v $PWD/examples:/etc/sluice:ro \
#     -e SLUICE_ADMIN_TOKEN=change-me sluice \
#     proxy --config /etc/sluice/routes-api.yaml --upstream http://app:9000 \
#     --listen 0.0.0.0:8080 --admin 0.0.0.0:9901 --log-format json
#
# Listeners: 8080 the proxy (or sluice serve's HTTP), 8081 sluice serve's gRPC, 9901 the
# admin listener. An admin listener off loopback needs a token (SLUICE_ADMIN_TOKEN).
#
# No HEALTHCHECK: the image has no shell or client to run one, and the orchestrator probes
# the admin listener instead: readiness GET /readyz (503 from SIGTERM on, while requests
# drain within --drain-grace), liveness GET /healthz (200 until the process exits). Give
# the container a stop timeout longer than --drain-grace.

FROM golang:1.26-bookworm AS build
WORKDIR /src
# Modules first, so that a source change does not fetch them again.
COPY go.mod go.sum go.work go.work.sum ./
COPY cmd/go.mod cmd/go.sum cmd/
COPY grpcgate/go.mod grpcgate/go.sum grpcgate/
COPY bench/go.mod bench/go.sum bench/
RUN go mod download
COPY . .
# A static binary; the version comes from the checkout when .git is in the context.
RUN CGO_ENABLED=0 go build -trimpath -buildvcs=auto -ldflags="-s -w" -o /out/sluice ./cmd/sluice

FROM gcr.io/distroless/static-debian12:nonroot AS run
COPY --from=build /out/sluice /usr/local/bin/sluice
USER 65532:65532
EXPOSE 8080 8081 9901
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/sluice"]
CMD ["--help"]
