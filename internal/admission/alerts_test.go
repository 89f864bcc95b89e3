package admission

import (
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"text/template"

	"github.com/prometheus/client_golang/prometheus"
	"gopkg.in/yaml.v3"

	"github.com/spillway-dev/spillway/internal/llm/upstream"
	"github.com/spillway-dev/spillway/internal/metrics"
)

const (
	alertsPath  = "../../configs/prometheus/alerts.yml"
	metricsDocs = "../../docs/METRICS.md"
)

type alertRule struct {
	Alert       string            `yaml:"alert"`
	Record      string            `yaml:"record"`
	Expr        string            `yaml:"expr"`
	For         string            `yaml:"for"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

type ruleFile struct {
	Groups []struct {
		Name  string      `yaml:"name"`
		Rules []alertRule `yaml:"rules"`
	} `yaml:"groups"`
}

func loadAlerts(tb testing.TB) []alertRule {
	tb.Helper()
	b, err := os.ReadFile(alertsPath)
	if err != nil {
		tb.Fatal(err)
	}
	var f ruleFile
	if err := yaml.Unmarshal(b, &f); err != nil {
		tb.Fatalf("parse %s: %v", alertsPath, err)
	}
	var rules []alertRule
	for _, g := range f.Groups {
		if g.Name == "" {
			tb.Errorf("%s: a group has no name", alertsPath)
		}
		rules = append(rules, g.Rules...)
	}
	if len(rules) == 0 {
		tb.Fatalf("%s holds no rules", alertsPath)
	}
	return rules
}

// recordingRegisterer remembers the collectors registered through it, so
// their descriptions name every metric, including vectors without children
// (which Gather leaves out).
type recordingRegisterer struct {
	prometheus.Registerer
	collectors []prometheus.Collector
}

func (r *recordingRegisterer) MustRegister(cs ...prometheus.Collector) {
	r.collectors = append(r.collectors, cs...)
	r.Registerer.MustRegister(cs...)
}

func (r *recordingRegisterer) Register(c prometheus.Collector) error {
	r.collectors = append(r.collectors, c)
	return r.Registerer.Register(c)
}

var fqNameRE = regexp.MustCompile(`fqName: "([^"]+)"`)

// registeredNames returns every metric name a fresh metrics.New registers.
func registeredNames(tb testing.TB) map[string]bool {
	tb.Helper()
	reg := prometheus.NewRegistry()
	rec := &recordingRegisterer{Registerer: reg}
	metrics.New(rec)
	// The per-upstream metrics are registered by the balancer, when there
	// are several upstreams.
	if _, err := upstream.NewPrometheus(rec); err != nil {
		tb.Fatal(err)
	}
	names := map[string]bool{}
	mfs, err := reg.Gather()
	if err != nil {
		tb.Fatal(err)
	}
	for _, mf := range mfs {
		names[mf.GetName()] = true
	}
	for _, c := range rec.collectors {
		ch := make(chan *prometheus.Desc, 16)
		go func() { c.Describe(ch); close(ch) }()
		for d := range ch {
			m := fqNameRE.FindStringSubmatch(d.String())
			if m == nil {
				tb.Fatalf("no fqName in %s", d)
			}
			names[m[1]] = true
		}
	}
	for _, n := range metrics.DocumentedNames {
		if !names[n] {
			tb.Fatalf("docs/OPERATIONS.md metric %s is not registered by metrics.New", n)
		}
	}
	return names
}

var metricNameRE = regexp.MustCompile(`\bspillway_[a-zA-Z0-9_]+`)

// baseName strips the series suffixes a histogram or summary exposes.
func baseName(n string) string {
	for _, s := range []string{"_bucket", "_sum", "_count"} {
		if b, ok := strings.CutSuffix(n, s); ok {
			return b
		}
	}
	return n
}

func TestAlertRules(t *testing.T) {
	t.Parallel()
	rules := loadAlerts(t)
	names := registeredNames(t)
	seen := map[string]bool{}
	for _, r := range rules {
		if r.Alert == "" {
			t.Errorf("rule %q has no alert name (recording rules do not belong in alerts.yml)", r.Record)
			continue
		}
		if seen[r.Alert] {
			t.Errorf("alert %s defined twice", r.Alert)
		}
		seen[r.Alert] = true
		if strings.TrimSpace(r.Expr) == "" || r.For == "" {
			t.Errorf("alert %s: expr and for are required", r.Alert)
		}
		if s := r.Labels["severity"]; s != "warning" && s != "critical" {
			t.Errorf("alert %s: labels.severity %q, want warning or critical", r.Alert, s)
		}
		if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
			t.Errorf("alert %s: annotations.summary and annotations.description are required", r.Alert)
		}
		used := metricNameRE.FindAllString(r.Expr, -1)
		if len(used) == 0 {
			t.Errorf("alert %s uses no spillway_ metric", r.Alert)
		}
		for _, n := range used {
			if !names[baseName(n)] {
				t.Errorf("alert %s uses %s, which metrics.New does not register", r.Alert, n)
			}
		}
	}
}

// TestMetricsDocumented checks docs/METRICS.md describes every metric.
func TestMetricsDocumented(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(metricsDocs)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	names := registeredNames(t)
	for n := range names {
		if !strings.Contains(doc, "| `"+n+"` |") {
			t.Errorf("%s has no table row for %s", metricsDocs, n)
		}
	}
	for _, n := range metricNameRE.FindAllString(doc, -1) {
		if !names[baseName(n)] {
			t.Errorf("%s mentions %s, which metrics.New does not register", metricsDocs, n)
		}
	}
}

// alertCase feeds promtool synthetic series (one sample a minute) and says
// which alerts must fire at evalAt, and that none fires yet at quietAt.
type alertCase struct {
	series  map[string]string // series → promtool values notation
	quietAt string
	evalAt  string
	want    []map[string]string // labels of each firing alert, beyond the rule's own
}

var alertCases = map[string]alertCase{
	"SpillwayQueueDepthHigh": {
		series: map[string]string{
			`spillway_queue_depth{job="api",instance="a"}`:          "8500x20",
			`spillway_queue_threshold{job="api",instance="a"}`:      "10000x20",
			`spillway_queue_depth{job="api2",instance="b"}`:         "7000x20", // 70%: fine
			`spillway_queue_threshold{job="api2",instance="b"}`:     "10000x20",
			`spillway_queue_depth{job="consumer",instance="c"}`:     "8500x20", // no gate there
			`spillway_queue_threshold{job="consumer",instance="c"}`: "0x20",
		},
		quietAt: "2m", evalAt: "10m",
		want: []map[string]string{{"job": "api"}},
	},
	"SpillwayQueueOverflowing": {
		series: map[string]string{
			`spillway_queue_rejections_total{job="api",instance="a",reason="overflow"}`: "0+60x20",
			`spillway_queue_rejections_total{job="api2",instance="b",reason="timeout"}`: "0+60x20",
		},
		quietAt: "1m", evalAt: "10m",
		want: []map[string]string{{"job": "api"}},
	},
	"SpillwayQueueWaitHigh": {
		series: map[string]string{
			// Every job waited between 10s and 30s: p99 ≈ 29.8s.
			`spillway_queue_wait_seconds_bucket{job="consumer",instance="c",le="10"}`:   "0x40",
			`spillway_queue_wait_seconds_bucket{job="consumer",instance="c",le="30"}`:   "0+60x40",
			`spillway_queue_wait_seconds_bucket{job="consumer",instance="c",le="60"}`:   "0+60x40",
			`spillway_queue_wait_seconds_bucket{job="consumer",instance="c",le="+Inf"}`: "0+60x40",
			// All under 1s.
			`spillway_queue_wait_seconds_bucket{job="api",instance="a",le="1"}`:    "0+60x40",
			`spillway_queue_wait_seconds_bucket{job="api",instance="a",le="+Inf"}`: "0+60x40",
		},
		quietAt: "5m", evalAt: "20m",
		want: []map[string]string{{"job": "consumer"}},
	},
	"SpillwayDeadLetterGrowing": {
		series: map[string]string{
			`spillway_dead_letter_depth{job="api",instance="a"}`:      "0+1x40",
			`spillway_dead_letter_depth{job="consumer",instance="c"}`: "5x40", // large but not growing
		},
		quietAt: "3m", evalAt: "25m",
		want: []map[string]string{{"job": "api"}},
	},
	"SpillwayCircuitOpen": {
		series: map[string]string{
			// Flapping open ↔ half-open still alerts.
			`spillway_circuit_state{job="api",instance="a",provider="openai"}`: "0 0 2 2 2 1 2 2 2 1 2 2 2 1 2 2",
			`spillway_circuit_state{job="api",instance="a",provider="sim"}`:    "0x15",
			`spillway_circuit_state{job="api",instance="b",provider="vllm"}`:   "1x15", // half-open only
		},
		quietAt: "3m", evalAt: "14m",
		want: []map[string]string{{"job": "api", "provider": "openai"}},
	},
	"SpillwayPoolFallback": {
		series: map[string]string{
			`spillway_pool_fallback{job="api",instance="a"}`: "0 0 1x10",
			`spillway_pool_fallback{job="api",instance="b"}`: "0x12",
		},
		quietAt: "2m", evalAt: "8m",
		want: []map[string]string{{"job": "api", "instance": "a"}},
	},
	"SpillwayStreamsFailing": {
		series: map[string]string{
			// 10% of accepted streams fail; refusals must not dilute that.
			`spillway_streams_total{job="api",instance="a",path="direct",outcome="done"}`:    "0+90x20",
			`spillway_streams_total{job="api",instance="a",path="direct",outcome="error"}`:   "0+10x20",
			`spillway_streams_total{job="api",instance="a",path="queued",outcome="refused"}`: "0+1000x20",
			// 1% fail: fine.
			`spillway_streams_total{job="api2",instance="b",path="direct",outcome="done"}`:  "0+99x20",
			`spillway_streams_total{job="api2",instance="b",path="direct",outcome="error"}`: "0+1x20",
		},
		quietAt: "2m", evalAt: "12m",
		want: []map[string]string{{"job": "api"}},
	},
	"SpillwaySubscriptionsLost": {
		series: map[string]string{
			`spillway_subscriptions_lost_total{job="api",instance="a",reason="connection_lost"}`: "0 0 0 1 1 1 1 1",
			`spillway_subscriptions_lost_total{job="api",instance="a",reason="overflow"}`:        "0x8",
		},
		quietAt: "3m", evalAt: "5m",
		want: []map[string]string{{"job": "api", "reason": "connection_lost"}},
	},
	"SpillwayDegradationCritical": {
		series: map[string]string{
			// Level 3 for good, after a spell at 2.
			`spillway_degradation_level{job="api",instance="a"}`: "0 2 2 3x12",
			// Another api at 3 only for a minute at a time.
			`spillway_degradation_level{job="api2",instance="b"}`: "3 0 3 0 3 0 3 0 3 0 3 0 3 0",
			// Level 2 for long is not critical.
			`spillway_degradation_level{job="api3",instance="c"}`: "2x14",
		},
		quietAt: "4m", evalAt: "10m",
		want: []map[string]string{{"job": "api"}},
	},
	"SpillwayMalformedMessages": {
		series: map[string]string{
			`spillway_malformed_messages_total{job="consumer",instance="c",source="queue"}`:     "0 0 3 3 3 3",
			`spillway_malformed_messages_total{job="api",instance="a",source="result_channel"}`: "0x6",
		},
		quietAt: "2m", evalAt: "4m",
		want: []map[string]string{{"job": "consumer", "source": "queue"}},
	},
}

// expand renders an annotation the way Prometheus does for the labels.
func expand(tb testing.TB, text string, labels map[string]string) string {
	tb.Helper()
	tmpl, err := template.New("").Option("missingkey=zero").Parse("{{$labels := .Labels}}{{$value := .Value}}" + text)
	if err != nil {
		tb.Fatalf("annotation %q: %v", text, err)
	}
	var b strings.Builder
	if err := tmpl.Execute(&b, struct {
		Labels map[string]string
		Value  float64
	}{labels, 0}); err != nil {
		tb.Fatalf("annotation %q: %v", text, err)
	}
	return b.String()
}

// TestAlertRulesPromtool loads the rules with promtool and checks each
// alert fires on its synthetic series, and only there.
func TestAlertRulesPromtool(t *testing.T) {
	t.Parallel()
	rules := loadAlerts(t)
	var alerts []string
	for _, r := range rules {
		alerts = append(alerts, r.Alert)
	}
	if got, want := slices.Sorted(maps.Keys(alertCases)), slices.Sorted(slices.Values(alerts)); !slices.Equal(got, want) {
		t.Fatalf("alert test cases for %v, alerts defined %v: every alert needs a case", got, want)
	}
	promtool, err := exec.LookPath("promtool")
	switch {
	case err != nil && testing.Short():
		t.Log("promtool not on PATH: -short checks the rules without it")
		return
	case err != nil:
		t.Fatal("promtool not on PATH: `make deps` installs it (Debian: apt-get install --no-install-recommends prometheus)")
	}
	abs, err := filepath.Abs(alertsPath)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.CommandContext(t.Context(), promtool, "check", "rules", abs).CombinedOutput(); err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}

	type expAlert struct {
		ExpLabels      map[string]string `yaml:"exp_labels"`
		ExpAnnotations map[string]string `yaml:"exp_annotations"`
	}
	type alertTest struct {
		EvalTime  string     `yaml:"eval_time"`
		AlertName string     `yaml:"alertname"`
		ExpAlerts []expAlert `yaml:"exp_alerts"`
	}
	type series struct {
		Series string `yaml:"series"`
		Values string `yaml:"values"`
	}
	type testGroup struct {
		Interval      string      `yaml:"interval"`
		InputSeries   []series    `yaml:"input_series"`
		AlertRuleTest []alertTest `yaml:"alert_rule_test"`
	}
	var groups []testGroup
	for _, r := range rules {
		c := alertCases[r.Alert]
		var exp []expAlert
		for _, extra := range c.want {
			labels := maps.Clone(extra)
			maps.Copy(labels, r.Labels)
			ann := map[string]string{}
			for k, v := range r.Annotations {
				ann[k] = expand(t, v, labels)
			}
			exp = append(exp, expAlert{ExpLabels: labels, ExpAnnotations: ann})
		}
		g := testGroup{Interval: "1m", AlertRuleTest: []alertTest{
			{EvalTime: c.quietAt, AlertName: r.Alert, ExpAlerts: []expAlert{}},
			{EvalTime: c.evalAt, AlertName: r.Alert, ExpAlerts: exp},
		}}
		for _, s := range slices.Sorted(maps.Keys(c.series)) {
			g.InputSeries = append(g.InputSeries, series{Series: s, Values: c.series[s]})
		}
		groups = append(groups, g)
	}
	b, err := yaml.Marshal(map[string]any{"rule_files": []string{abs}, "evaluation_interval": "1m", "tests": groups})
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "alerts_test.yml")
	if err := os.WriteFile(file, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.CommandContext(t.Context(), promtool, "test", "rules", file).CombinedOutput(); err != nil {
		t.Fatalf("promtool test rules: %v\n%s\ntest file:\n%s", err, out, b)
	}
}
