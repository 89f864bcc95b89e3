// Package deploy holds Spillway's Kubernetes manifests (base/ and
// overlays/, applied with kustomize) and the offline checks, run by `make
// test`, of every deployment file in the repository: docker-compose.yml,
// configs/ (nginx, Prometheus, Grafana) and these manifests. It has no Go
// code of its own; docs/DEPLOY.md explains the deployment.
package deploy
