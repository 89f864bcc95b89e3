package deploy_test

import (
	"errors"
	"fmt"
	"io/fs"

	"strings"
	"testing"
	"testing/fstest"

	corev1 "k8s.io/api/core/v1"
)

// overlays are the kustomize overlays deploy/ ships; each must render
// and pass every check.
var overlays = []string{"deploy/overlays/redis-streams", "deploy/overlays/kafka"}

// composeEnvFiles are the --env-file variants of docker-compose.yml
// (docs/DEPLOY.md); "" is the plain `docker compose up`.
var composeEnvFiles = []string{"", "configs/compose/cluster.env", "configs/compose/tracing.env"}

// checkAll runs every deployment check on a repository tree.
func checkAll(fsys fs.FS) error {
	var all []error
	raw, err := fs.ReadFile(fsys, "docker-compose.yml")
	if err != nil {
		return err
	}
	_, composeVars, err := decodeCompose(string(raw), nil)
	if err != nil {
		return fmt.Errorf("docker-compose.yml: %w", err)
	}
	for _, ef := range composeEnvFiles {
		environ := map[string]string{}
		label := "no env file"
		if ef != "" {
			label = ef
			b, err := fs.ReadFile(fsys, ef)
			if err != nil {
				all = append(all, err)
				continue
			}
			if environ, err = readEnvFile(b); err != nil {
				all = append(all, fmt.Errorf("%s: %w", ef, err))
				continue
			}
			for k := range environ {
				if !composeVars[k] {
					all = append(all, fmt.Errorf("%s: %s is not used by docker-compose.yml (no ${%s})", ef, k, k))
				}
			}
		}
		all = append(all, checkCompose(fsys, environ, label))
	}
	envFiles, _ := fs.Glob(fsys, "configs/compose/*.env")
	for _, f := range envFiles {
		listed := false
		for _, ef := range composeEnvFiles {
			listed = listed || ef == f
		}
		if !listed {
			all = append(all, fmt.Errorf("%s is not checked: add it to composeEnvFiles", f))
		}
	}
	base, err := render(fsys, "deploy/base")
	if err != nil {
		all = append(all, err)
	} else {
		all = append(all, checkObjects(fsys, "deploy/base", base, false))
	}
	dirs, _ := fs.Glob(fsys, "deploy/overlays/*")
	if len(dirs) != len(overlays) {
		all = append(all, fmt.Errorf("deploy/overlays holds %v, the checks know %v", dirs, overlays))
	}
	for _, o := range overlays {
		objs, err := render(fsys, o)
		if err != nil {
			all = append(all, err)
			continue
		}
		all = append(all, checkObjects(fsys, o, objs, true))
	}
	return errors.Join(all...)
}

// TestDeploymentFiles checks the repository's compose file, nginx,
// Prometheus and Grafana configuration, and Kubernetes manifests.
func TestDeploymentFiles(t *testing.T) {
	t.Parallel()
	if err := checkAll(repoFiles(t)); err != nil {
		for _, line := range strings.Split(err.Error(), "\n") {
			t.Error(line)
		}
	}
}

// TestRenderedOverlays pins what the overlays produce, so a check that
// silently saw nothing (an empty render) cannot pass.
func TestRenderedOverlays(t *testing.T) {
	t.Parallel()
	fsys := repoFiles(t)
	for _, o := range overlays {
		objs, err := render(fsys, o)
		if err != nil {
			t.Fatalf("%s: %v", o, err)
		}
		kinds := map[string]int{}
		for _, x := range objs {
			kinds[x.gvk]++
			if objectMeta(x.obj).Namespace != "spillway" {
				t.Errorf("%s: %s %s not in namespace spillway", o, x.gvk, x.name)
			}
		}
		want := map[string]int{"apps/v1/Deployment": 2, "v1/Service": 2, "policy/v1/PodDisruptionBudget": 2,
			"autoscaling/v2/HorizontalPodAutoscaler": 1, "keda.sh/v1alpha1/ScaledObject": 1,
			"monitoring.coreos.com/v1/ServiceMonitor": 2, "v1/ConfigMap": 1}
		for k, n := range want {
			if kinds[k] != n {
				t.Errorf("%s: %d %s, want %d", o, kinds[k], k, n)
			}
		}
	}
	objs, err := render(fsys, "deploy/overlays/kafka")
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range objs {
		if x.gvk == "v1/ConfigMap" {
			data := x.obj.(*corev1.ConfigMap).Data
			if data["QUEUE_TYPE"] != "kafka" || data["KAFKA_PARTITIONS"] != "12" || data["WORKER_CONCURRENCY"] != "16" {
				t.Errorf("kafka overlay: ConfigMap patch not merged into the base: %v", data)
			}
		}
	}
}

// breakage is one deliberate fault: replace old with new in file, and the
// checks must report an error containing want.
type breakage struct {
	name, file, old, new, want string
}

var breakages = []breakage{
	// docker-compose.yml
	{"compose unknown field", "docker-compose.yml", "    stop_grace_period: 35s\n    depends_on:\n      redis: {condition: service_healthy}\n      redis-cluster-init",
		"    stop_grace_periode: 35s\n    depends_on:\n      redis: {condition: service_healthy}\n      redis-cluster-init", "field stop_grace_periode not found"},
	{"compose unknown env name", "docker-compose.yml", "WORKER_CONCURRENCY: \"16\"", "WORKER_CONCURENCY: \"16\"", "WORKER_CONCURENCY is not a Spillway setting"},
	{"compose invalid setting value", "docker-compose.yml", "WORKER_CONCURRENCY: \"16\"", "WORKER_CONCURRENCY: \"0\"", "do not pass Spillway's validation"},
	{"compose depends_on unknown service", "docker-compose.yml", "      simllm: {condition: service_started}\n\n  consumer:", "      simlm: {condition: service_started}\n\n  consumer:", "depends_on unknown service simlm"},
	{"compose healthy without healthcheck", "docker-compose.yml", "      simllm: {condition: service_started}\n\n  consumer:", "      simllm: {condition: service_healthy}\n\n  consumer:", "simllm has no healthcheck"},
	{"compose required profile dependency", "docker-compose.yml", "redis-cluster-init: {condition: service_completed_successfully, required: false}\n      simllm: {condition: service_started}\n\n  consumer:",
		"redis-cluster-init: {condition: service_completed_successfully}\n      simllm: {condition: service_started}\n\n  consumer:", "mark it required: false"},
	{"compose api pinned to host port", "docker-compose.yml", "    expose: [\"8080\"]", "    expose: [\"8080\"]\n    ports: [\"8081:8080\"]", "must not publish host ports"},
	{"compose host port clash", "docker-compose.yml", "ports: [\"3000:3000\"]", "ports: [\"9091:3000\"]", "host port 9091 already taken"},
	{"compose missing bind mount", "docker-compose.yml", "./configs/prometheus:/etc/prometheus:ro", "./configs/prometheus-gone:/etc/prometheus:ro", "does not exist in the repository"},
	{"compose undeclared volume", "docker-compose.yml", "- redis-data:/data", "- redis-dat:/data", "named volume redis-dat is not declared"},
	{"compose short stop grace", "docker-compose.yml", "    stop_grace_period: 35s\n    depends_on:\n      redis: {condition: service_healthy}\n      redis-cluster-init: {condition: service_completed_successfully, required: false}\n      simllm: {condition: service_started}\n\n  consumer:",
		"    stop_grace_period: 20s\n    depends_on:\n      redis: {condition: service_healthy}\n      redis-cluster-init: {condition: service_completed_successfully, required: false}\n      simllm: {condition: service_started}\n\n  consumer:", "must exceed SHUTDOWN_GRACE_SECONDS"},
	{"compose env host not a service", "docker-compose.yml", "LLM_BASE_URL: http://simllm:8081/v1", "LLM_BASE_URL: http://simlm:8081/v1", "names host \"simlm\""},
	{"compose env wrong port", "docker-compose.yml", "LLM_BASE_URL: http://simllm:8081/v1", "LLM_BASE_URL: http://simllm:9999/v1", "simllm answers on"},
	{"compose unsupported interpolation", "docker-compose.yml", "QUEUE_TYPE: ${QUEUE_TYPE:-redis}", "QUEUE_TYPE: ${QUEUE_TYPE:?set it}", "unsupported interpolation"},
	{"compose undocumented profile", "docker-compose.yml", "profiles: [\"tracing\"]", "profiles: [\"traces\"]", "profile traces is not explained"},
	{"compose env file var unused", "configs/compose/tracing.env", "OTEL_EXPORTER_OTLP_ENDPOINT=http://jaeger:4318", "OTEL_EXPORTER_OTLP_ENDPOINT=http://jaeger:4318\nOTEL_ENDPOINT=x", "OTEL_ENDPOINT is not used"},
	{"compose cluster node not a service", "configs/compose/cluster.env", "redis-node-3:6379", "redis-node-4:6379", "names host \"redis-node-4\""},
	// nginx
	{"nginx upstream not a service", "configs/nginx.conf", "server api:8080 resolve;", "server web:8080 resolve;", "names web, which is no service"},
	{"nginx upstream wrong port", "configs/nginx.conf", "server api:8080 resolve;", "server api:8000 resolve;", "names api:8000"},
	{"nginx upstream without resolve", "configs/nginx.conf", "server api:8080 resolve;", "server api:8080;", "without resolve"},
	{"nginx proxy_pass unknown upstream", "configs/nginx.conf", "proxy_pass http://spillway_api;", "proxy_pass http://spillway;", "which is no upstream block"},
	{"nginx buffering on", "configs/nginx.conf", "proxy_buffering off;", "proxy_buffering on;", "SSE needs proxy_buffering off"},
	{"nginx short read timeout", "configs/nginx.conf", "proxy_read_timeout 120s;", "proxy_read_timeout 10s;", "must exceed HEARTBEAT_INTERVAL_SECONDS"},
	// Prometheus
	{"prometheus unknown field", "configs/prometheus/prometheus.yml", "refresh_interval: 5s", "refresh_intervall: 5s", "field refresh_intervall not found"},
	{"prometheus target not a service", "configs/prometheus/prometheus.yml", "names: [\"consumer\"]", "names: [\"consumers\"]", "scrapes consumers, which is no service"},
	{"prometheus wrong port", "configs/prometheus/prometheus.yml", "port: 9090", "port: 9091", "scrapes consumer:9091"},
	{"prometheus api pinned", "configs/prometheus/prometheus.yml", "  - job_name: spillway-api\n    dns_sd_configs:\n      - names: [\"api\"]\n        type: A\n        port: 8080\n        refresh_interval: 5s",
		"  - job_name: spillway-api\n    static_configs:\n      - targets: [\"api:8080\"]", "api replicas are not discovered by DNS"},
	{"prometheus missing rule file", "configs/prometheus/prometheus.yml", "/etc/prometheus/alerts.yml", "/etc/prometheus/rules.yml", "rule file /etc/prometheus/rules.yml is not mounted"},
	// Grafana
	{"grafana datasource host", "configs/grafana/provisioning/datasources/datasources.yml", "url: http://prometheus:9090", "url: http://prom:9090", "points at prom, which is no service"},
	{"grafana datasource unknown field", "configs/grafana/provisioning/datasources/datasources.yml", "isDefault: true", "isDefault: true\n    default: true", "field default not found"},
	{"dashboard unknown metric", "configs/grafana/dashboards/spillway.json", "max(spillway_dead_letter_depth)", "max(spillway_dead_letters)", "metric spillway_dead_letters does not exist"},
	{"dashboard duplicate panel id", "configs/grafana/dashboards/spillway.json", "\"id\": 3,", "\"id\": 2,", "panel id 2 used by"},
	{"dashboard panel without datasource", "configs/grafana/dashboards/spillway.json", "\"datasource\": {\n        \"type\": \"prometheus\",\n        \"uid\": \"prometheus\"\n      },\n      \"gridPos\"", "\"datasource\": {\n        \"type\": \"prometheus\",\n        \"uid\": \"prom\"\n      },\n      \"gridPos\"", "is not provisioned"},
	{"dashboard missing required metric", "configs/grafana/dashboards/spillway.json", "max(spillway_degradation_level)", "max(spillway_queue_depth)", "no panel shows spillway_degradation_level"},
	{"dashboard broken JSON", "configs/grafana/dashboards/spillway.json", "\"panels\": [", "\"panels\": [[", "dashboard JSON"},
	// Kubernetes
	{"k8s unknown field", "deploy/base/api-deployment.yaml", "terminationGracePeriodSeconds: 45", "terminationGracePeriod: 45", "unknown field \"spec.template.spec.terminationGracePeriod\""},
	{"k8s misplaced field", "deploy/base/api-service.yaml", "  clusterIP", "  clusterIP", ""}, // placeholder replaced below
	{"k8s service selector mismatch", "deploy/base/api-service.yaml", "  selector:\n    app.kubernetes.io/name: spillway\n    app.kubernetes.io/component: api",
		"  selector:\n    app.kubernetes.io/name: spillway\n    app.kubernetes.io/component: web", "matches 0 Deployments"},
	{"k8s service targetPort unknown", "deploy/base/api-service.yaml", "targetPort: http", "targetPort: web", "targets web, which no container"},
	{"k8s probe path not served", "deploy/base/consumer-deployment.yaml", "path: /healthz\n              port: metrics\n            periodSeconds: 5", "path: /readyz\n              port: metrics\n            periodSeconds: 5", "probe path /readyz is not served by consumer"},
	{"k8s probe port unknown", "deploy/base/api-deployment.yaml", "path: /readyz\n              port: http", "path: /readyz\n              port: web", "uses port web"},
	{"k8s unknown env name", "deploy/base/configmap.yaml", "WORKER_CONCURRENCY: \"16\"", "WORKERS: \"16\"", "WORKERS is not a Spillway setting"},
	{"k8s invalid setting", "deploy/base/configmap.yaml", "LLM_BASE_URL: http://vllm.llm.svc.cluster.local:8000/v1", "LLM_BASE_URL: vllm", "do not pass Spillway's validation"},
	{"k8s configmap missing", "deploy/base/consumer-deployment.yaml", "name: spillway-config", "name: spillway-settings", "ConfigMap spillway-settings does not exist"},
	{"k8s secret undocumented", "deploy/base/api-deployment.yaml", "key: url", "key: redis-url", "Secret spillway-redis key redis-url"},
	{"k8s grace too short", "deploy/base/api-deployment.yaml", "terminationGracePeriodSeconds: 45", "terminationGracePeriodSeconds: 30", "terminationGracePeriodSeconds 30 < preStop 10s"},
	{"k8s grace vs configmap", "deploy/base/configmap.yaml", "SHUTDOWN_GRACE_SECONDS: \"25\"", "SHUTDOWN_GRACE_SECONDS: \"60\"", "SHUTDOWN_GRACE_SECONDS 60s"},
	{"k8s no preStop on served pods", "deploy/base/api-deployment.yaml", "            preStop:\n              sleep:\n                seconds: 10", "            postStart:\n              sleep:\n                seconds: 10", "needs a preStop sleep"},
	{"k8s GOMEMLIMIT not from limit", "deploy/base/api-deployment.yaml", "containerName: api\n                  resource: limits.memory", "containerName: api\n                  resource: requests.memory", "GOMEMLIMIT must come from"},
	{"k8s no memory limit", "deploy/base/consumer-deployment.yaml", "            limits:\n              memory: 512Mi\n", "", "no memory limit"},
	{"k8s hpa wrong target", "deploy/base/api-hpa.yaml", "name: spillway-api\n  minReplicas", "name: spillway-consumer\n  minReplicas", "the HPA is for the api"},
	{"k8s hpa unknown metric", "deploy/base/api-hpa.yaml", "name: spillway_active_streams", "name: spillway_open_streams", "spillway_open_streams is not a Spillway metric"},
	{"k8s pdb selector", "deploy/base/consumer-pdb.yaml", "    matchLabels:\n      app.kubernetes.io/name: spillway\n      app.kubernetes.io/component: consumer", "    matchLabels:\n      app.kubernetes.io/name: spillway\n      app.kubernetes.io/component: worker", "selector matches 0 Deployments"},
	{"k8s servicemonitor port", "deploy/base/servicemonitor-consumer.yaml", "- port: metrics", "- port: http", "endpoint port \"http\" is no named port"},
	{"k8s servicemonitor selector", "deploy/base/servicemonitor-api.yaml", "component: api\n  endpoints", "component: web\n  endpoints", "selector matches no Service"},
	{"k8s resource not listed", "deploy/base/kustomization.yaml", "  - consumer-pdb.yaml\n", "", "consumer-pdb.yaml is in the directory but not listed"},
	{"k8s resource missing", "deploy/base/kustomization.yaml", "  - consumer-pdb.yaml\n", "  - consumer-pdb.yaml\n  - gone.yaml\n", "resource gone.yaml does not exist"},
	{"k8s secret committed", "deploy/base/configmap.yaml", "kind: ConfigMap", "kind: Secret", "a Secret is committed"},
	{"keda unknown spec field", "deploy/overlays/redis-streams/scaledobject.yaml", "cooldownPeriod: 120", "coolDownPeriod: 120", "unknown field \"spec.coolDownPeriod\""},
	{"keda unknown trigger type", "deploy/overlays/redis-streams/scaledobject.yaml", "type: redis-streams", "type: redis-stream", "trigger type \"redis-stream\""},
	{"keda missing required metadata", "deploy/overlays/redis-streams/scaledobject.yaml", "consumerGroup: streaming_failover_consumers", "group: streaming_failover_consumers", "metadata consumerGroup is required"},
	{"keda wrong stream", "deploy/overlays/redis-streams/scaledobject.yaml", "stream: queue:streaming_requests_failover\n", "stream: queue:requests\n", "stream \"queue:requests\", the consumer reads"},
	{"keda line without trigger", "deploy/overlays/redis-streams/scaledobject.yaml", "stream: queue:streaming_requests_failover:low", "stream: queue:streaming_requests_failover", "no redis-streams trigger on queue:streaming_requests_failover:low"},
	{"keda wrong target", "deploy/overlays/redis-streams/scaledobject.yaml", "name: spillway-consumer\n  pollingInterval", "name: spillway-worker\n  pollingInterval", "which is no Deployment here"},
	{"keda pending above concurrency", "deploy/overlays/redis-streams/scaledobject.yaml", "pendingEntriesCount: \"12\"", "pendingEntriesCount: \"20\"", "would never scale up"},
	{"keda auth missing", "deploy/overlays/redis-streams/triggerauthentication.yaml", "name: spillway-redis\n  labels", "name: redis-auth\n  labels", "authenticationRef spillway-redis is no TriggerAuthentication"},
	{"keda auth undocumented secret key", "deploy/overlays/redis-streams/triggerauthentication.yaml", "key: password", "key: redis-password", "key redis-password, which docs/DEPLOY.md"},
	{"keda kafka brokers differ", "deploy/overlays/kafka/scaledobject.yaml", "bootstrapServers: kafka-0", "bootstrapServers: kafka-9", "the consumer's KAFKA_BROKERS"},
	{"keda kafka above partitions", "deploy/overlays/kafka/configmap-kafka.yaml", "KAFKA_PARTITIONS: \"12\"", "KAFKA_PARTITIONS: \"4\"", "above KAFKA_PARTITIONS 4"},
	{"keda kafka queue type", "deploy/overlays/kafka/configmap-kafka.yaml", "QUEUE_TYPE: kafka", "QUEUE_TYPE: redis", "the consumer's QUEUE_TYPE is redis"},
	{"keda replicas beyond pool", "deploy/overlays/redis-streams/scaledobject.yaml", "maxReplicaCount: 7", "maxReplicaCount: 30", "extra consumers would only wait"},
	{"kustomize patch target missing", "deploy/overlays/kafka/configmap-kafka.yaml", "name: spillway-config", "name: spillway-cfg", "patch target v1/ConfigMap spillway-cfg does not exist"},
	{"kustomize unsupported patch", "deploy/overlays/kafka/configmap-kafka.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: spillway-config\ndata:\n  QUEUE_TYPE: kafka",
		"apiVersion: v1\nkind: Service\nmetadata:\n  name: spillway-api\nspec:\n  type: NodePort\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: spillway-config\ndata:\n  QUEUE_TYPE: kafka", "patches of v1/Service are not rendered"},
	{"image user not numeric", "Dockerfile", "USER 65532:65532", "USER nonroot", "runAsNonRoot needs runAsUser or a numeric"},
	{"route removed from the api", "internal/app/api.go", "e.GET(\"/readyz\"", "e.GET(\"/ready\"", "no longer registers /readyz"},
}

func init() {
	// A field valid on one type but not where it is placed.
	for i := range breakages {
		if breakages[i].name == "k8s misplaced field" {
			breakages[i].old = "spec:\n  selector:"
			breakages[i].new = "spec:\n  replicas: 2\n  selector:"
			breakages[i].want = "unknown field \"spec.replicas\""
		}
	}
}

// TestChecksCatchBreakage feeds each deliberate fault and asserts the
// checks report it: every check can fail.
func TestChecksCatchBreakage(t *testing.T) {
	t.Parallel()
	orig := repoFiles(t)
	for _, b := range breakages {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			f, ok := orig[b.file]
			if !ok {
				t.Fatalf("no file %s", b.file)
			}
			if !strings.Contains(string(f.Data), b.old) {
				t.Fatalf("%s no longer contains %q: update this case", b.file, b.old)
			}
			broken := fstest.MapFS{}
			for k, v := range orig {
				broken[k] = v
			}
			broken[b.file] = &fstest.MapFile{Data: []byte(strings.Replace(string(f.Data), b.old, b.new, 1))}
			err := checkAll(broken)
			if err == nil {
				t.Fatalf("no error")
			}
			if !strings.Contains(err.Error(), b.want) {
				t.Fatalf("error does not mention %q:\n%v", b.want, err)
			}
		})
	}
}
