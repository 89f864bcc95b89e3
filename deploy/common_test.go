package deploy_test

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"net"
	"net/url"
	"os"
	"path"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/spillway-dev/spillway/internal/config"
	"github.com/spillway-dev/spillway/internal/llm/upstream"
	"github.com/spillway-dev/spillway/internal/metrics"
)

// repoFiles loads, from the repository root, every file the checks read
// into an in-memory tree, so the table tests can break one file at a time.
func repoFiles(tb testing.TB) fstest.MapFS {
	tb.Helper()
	root := os.DirFS("..")
	m := fstest.MapFS{}
	for _, dir := range []string{"configs", "deploy"} {
		err := fs.WalkDir(root, dir, func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			if path.Ext(p) == ".go" {
				return nil
			}
			b, err := fs.ReadFile(root, p)
			if err != nil {
				return err
			}
			m[p] = &fstest.MapFile{Data: b}
			return nil
		})
		if err != nil {
			tb.Fatalf("reading %s: %v", dir, err)
		}
	}
	for _, p := range []string{"docker-compose.yml", "Dockerfile", "docs/DEPLOY.md", "internal/app/api.go", "internal/app/consumer.go"} {
		b, err := fs.ReadFile(root, p)
		if err != nil {
			tb.Fatalf("reading %s: %v", p, err)
		}
		m[p] = &fstest.MapFile{Data: b}
	}
	return m
}

// errs collects findings; every check appends to one and reports them all.
type errs []error

func (e *errs) add(format string, args ...any) { *e = append(*e, fmt.Errorf(format, args...)) }

func (e errs) err() error { return errors.Join(e...) }

// configKeys is every env name internal/config reads, found by reflecting
// over the `env` tags of config.Config (nested structs included).
var configKeys = func() map[string]bool {
	keys := map[string]bool{}
	var walk func(t reflect.Type, prefix string)
	walk = func(t reflect.Type, prefix string) {
		for i := range t.NumField() {
			f := t.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("env"), ",")
			ft := f.Type
			for ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if name == "" && ft.Kind() == reflect.Struct {
				walk(ft, prefix+f.Tag.Get("envPrefix"))
				continue
			}
			if name != "" {
				keys[prefix+name] = true
			}
		}
	}
	walk(reflect.TypeFor[config.Config](), "")
	return keys
}()

// pendingConfigKeys are settings of the design's configuration table that
// the deployment files use before internal/config reads them (the
// scale-out work adds them). A process ignores a variable it does not
// read, so using them early is harmless; TestPendingNamesLanded says when
// one can leave this list.
var pendingConfigKeys = map[string]bool{
	"REDIS_CLUSTER_ADDRS": true,
}

// runtimeKeys are variables read by the Go runtime or the OpenTelemetry SDK
// (docs/DEPLOY.md, tracing), not by internal/config.
var runtimeKeys = map[string]bool{
	"GOMEMLIMIT": true, "GOMAXPROCS": true, "GOGC": true,
	"OTEL_EXPORTER_OTLP_ENDPOINT": true, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": true,
	"OTEL_EXPORTER_OTLP_PROTOCOL": true, "OTEL_SERVICE_NAME": true, "OTEL_RESOURCE_ATTRIBUTES": true,
	"OTEL_TRACES_SAMPLER": true, "OTEL_TRACES_SAMPLER_ARG": true, "OTEL_PROPAGATORS": true,
	"OTEL_BSP_SCHEDULE_DELAY": true, "OTEL_BSP_EXPORT_TIMEOUT": true,
	"OTEL_BSP_MAX_QUEUE_SIZE": true, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": true,
}

// checkEnvName reports a variable given to a Spillway process that nothing
// reads: a typo there silently leaves the default in place.
func checkEnvName(e *errs, where, name string) {
	if configKeys[name] || pendingConfigKeys[name] || runtimeKeys[name] {
		return
	}
	e.add("%s: environment variable %s is not a Spillway setting (internal/config), nor a Go runtime or OTEL_* variable", where, name)
}

// loadConfig runs Spillway's own loader and validation on env, as the
// process would at start.
func loadConfig(env map[string]string) (*config.Config, error) {
	return config.Load("", env)
}

// implementedMetrics is every metric name internal/metrics registers, and
// the per-upstream ones the balancer of several upstreams registers
// (internal/llm/upstream), captured by a Registerer that asks each collector
// to describe itself.
var implementedMetrics = func() map[string]bool {
	r := &describeRecorder{names: map[string]bool{}}
	metrics.New(r)
	_, _ = upstream.NewPrometheus(r) // the recorder accepts every collector
	return r.names
}()

type describeRecorder struct{ names map[string]bool }

func (r *describeRecorder) Register(c prometheus.Collector) error {
	ch := make(chan *prometheus.Desc, 16)
	go func() { c.Describe(ch); close(ch) }()
	for d := range ch {
		if m := regexp.MustCompile(`fqName: "([a-zA-Z_:][a-zA-Z0-9_:]*)"`).FindStringSubmatch(d.String()); m != nil {
			r.names[m[1]] = true
		}
	}
	return nil
}

func (r *describeRecorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		_ = r.Register(c)
	}
}

func (r *describeRecorder) Unregister(prometheus.Collector) bool { return false }

// pendingMetrics are names in the design's metric list that
// internal/metrics does not register yet. None today: the dashboard's
// panels all have their metric. A name added to the design before its
// code goes here, and its panel stays empty until it lands.
var pendingMetrics = map[string]bool{}

// TestPendingNamesLanded logs pending names that now exist, so the lists
// above shrink as the work lands, and fails if the recorder found nothing
// (the metric check would then accept nothing real).
func TestPendingNamesLanded(t *testing.T) {
	t.Parallel()
	if !implementedMetrics["spillway_streams_total"] || !implementedMetrics["spillway_queue_wait_seconds"] {
		t.Fatalf("metric names from internal/metrics not captured: %v", sortedKeys(implementedMetrics))
	}
	if !configKeys["SHUTDOWN_GRACE_SECONDS"] || !configKeys["REDIS_URL"] {
		t.Fatalf("config keys not captured: %v", sortedKeys(configKeys))
	}
	for name := range pendingMetrics {
		if implementedMetrics[name] {
			t.Logf("%s is implemented now: remove it from pendingMetrics", name)
		}
	}
	for name := range pendingConfigKeys {
		if configKeys[name] {
			t.Logf("%s is read by internal/config now: remove it from pendingConfigKeys", name)
		}
	}
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// hostOf returns the host of "host:port", a URL, or a bare host.
func hostOf(s string) string {
	if strings.Contains(s, "://") {
		if u, err := url.Parse(s); err == nil {
			return u.Hostname()
		}
	}
	if h, _, err := net.SplitHostPort(s); err == nil {
		return h
	}
	return s
}

// portOf returns the port of a listen address such as ":8080".
func portOf(addr string) string {
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		return ""
	}
	return p
}

// servedPaths are the probe paths each process serves, with the file that
// registers the route: the check reads that file, so removing a route
// there fails it.
var servedPaths = map[string]map[string]string{
	"api":      {"/healthz": "internal/app/api.go", "/readyz": "internal/app/api.go"},
	"consumer": {"/healthz": "internal/app/consumer.go"},
}

// checkProbePath reports a probe on a path the process does not serve.
func checkProbePath(e *errs, fsys fs.FS, where, process, p string) {
	src, ok := servedPaths[process][p]
	if !ok {
		e.add("%s: probe path %s is not served by %s (served: %v)", where, p, process, sortedKeys(servedPaths[process]))
		return
	}
	b, err := fs.ReadFile(fsys, src)
	if err != nil {
		e.add("%s: reading %s: %v", where, src, err)
		return
	}
	if !strings.Contains(string(b), `"`+p+`"`) && !strings.Contains(string(b), ` `+p+`"`) {
		e.add("%s: %s no longer registers %s", where, src, p)
	}
}

// ceilDiv is ⌈a/b⌉ for positive b.
func ceilDiv(a, b int) int { return int(math.Ceil(float64(a) / float64(b))) }
