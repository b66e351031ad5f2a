# The operator's image: make docker-build (IMG=egress-proxies-operator:latest). It holds
# both binaries: /manager (the entrypoint) and /gateway, which the gateway's Deployment
# runs as its command. They are static (no cgo: libvirt is spoken over its RPC protocol, SSH by
# golang.org/x/crypto), so it runs on distroless/static as the nonroot user, whose
# uid/gid 65532 the Deployment's securityContext names.

FROM golang:1.26 AS builder
ARG TARGETOS=linux
ARG TARGETARCH
WORKDIR /src
# Modules first, so a source change does not download them again.
COPY go.mod go.sum ./
RUN go mod download
COPY api/ api/
COPY cmd/ cmd/
COPY internal/ internal/
RUN CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH} \
    go build -trimpath -ldflags="-s -w" -o /manager ./cmd/manager && \
    CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH} \
    go build -trimpath -ldflags="-s -w" -o /gateway ./cmd/gateway

FROM gcr.io/distroless/static:nonroot
COPY --from=builder /manager /manager
COPY --from=builder /gateway /gateway
USER 65532:65532
ENTRYPOINT ["/manager"]
