# One image for every Spillway process; choose with the command
# (api, consumer, simllm, loadtest, spillway-admin). docker-compose.yml and the Kubernetes
# manifests in deploy/ run it with `api` or `consumer` (docs/DEPLOY.md).
# Distroless: no shell, so Kubernetes' preStop uses the kubelet's sleep.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o /out/ ./cmd/...

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/ /usr/local/bin/
COPY configs/spillway.yaml /etc/spillway/spillway.yaml
# distroless "nonroot", by number: Kubernetes can only verify runAsNonRoot
# against a numeric user.
USER 65532:65532
# api (HTTP_ADDR), consumer metrics and health (CONSUMER_HTTP_ADDR).
EXPOSE 8080 9090
ENTRYPOINT []
CMD ["api"]
