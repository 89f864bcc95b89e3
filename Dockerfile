# One image for every Spillway process; choose with the command
# (api, consumer, simllm, loadtest).
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o /out/ ./cmd/...

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/ /usr/local/bin/
COPY configs/spillway.yaml /etc/spillway/spillway.yaml
USER nonroot
ENTRYPOINT []
CMD ["api"]
