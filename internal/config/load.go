package config

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caarlos0/env/v11"
	"gopkg.in/yaml.v3"

	"github.com/spillway-dev/spillway/internal/llm/upstream"
)

// Derived defaults: they depend on the Redis mode, so Load fills them in
// after reading the settings rather than Defaults.
const (
	defaultPoolSize         = 100
	defaultEmbeddedPoolSize = 2
)

// FieldError is one bad setting. Load and Validate return every FieldError
// they find, joined with errors.Join; walk the tree to collect them.
type FieldError struct {
	// Var is the env name of the setting, e.g. "WORKER_CONCURRENCY".
	Var string
	// Err says what is wrong, phrased to follow Var in a sentence.
	Err error
}

// Error returns the env name followed by what is wrong with its value.
func (e *FieldError) Error() string { return e.Var + " " + e.Err.Error() }

// Unwrap returns the underlying cause.
func (e *FieldError) Unwrap() error { return e.Err }

// FromEnv is Load with the process environment. path may be empty.
func FromEnv(path string) (*Config, error) {
	return Load(path, environMap(os.Environ()))
}

// Load builds a Config from the defaults, then the YAML file at path (skipped
// when path is empty), then environ, later sources winning, and validates it.
//
// The file's keys are the env names in lower case; a list value is the same
// as a comma-separated string. An unknown key is an error. A setting that is
// empty (an env var set to "", a YAML null or "") counts as not set, so it
// neither overrides the file nor the default: docker-compose passes
// `${VAR}` of an unset host variable as "", and that must not erase a value.
//
// CONNECTION_POOL_SIZE (unset or 0), POOL_BACKEND (unset) and
// CORS_ALLOWED_ORIGINS (unset) get defaults that depend on the mode: 2,
// "local" and "*" without REDIS_URL (embedded), 100, "redis" and none with it.
func Load(path string, environ map[string]string) (*Config, error) {
	var yamlUpstreams []upstream.Spec
	merged := make(map[string]string)
	source := make(map[string]string)
	if path != "" {
		fileVals, ups, err := readFile(path)
		if err != nil {
			return nil, fmt.Errorf("config: %w", err)
		}
		yamlUpstreams = ups
		for k, v := range fileVals {
			merged[k] = v
			source[k] = "in " + path
		}
	}
	for k, v := range environ {
		if v == "" {
			continue
		}
		merged[k] = v
		source[k] = "in env"
	}

	c := Defaults()
	rest, durErr := parseDurations(&c, merged, source)
	if err := env.ParseWithOptions(&c, env.Options{Environment: rest}); err != nil || durErr != nil {
		if err != nil {
			err = nameParseErrors(err, source)
		}
		return nil, fmt.Errorf("config: %w", errors.Join(durErr, err))
	}
	c.KafkaBrokers = cleanList(c.KafkaBrokers)
	c.RedisClusterAddrs = cleanList(c.RedisClusterAddrs)
	c.RedisSentinelAddrs = cleanList(c.RedisSentinelAddrs)
	c.APIKeys = cleanList(c.APIKeys)
	c.TrustedProxies = cleanList(c.TrustedProxies)
	c.LLMModels = cleanList(c.LLMModels)
	c.LLMModel = strings.TrimSpace(c.LLMModel)
	c.CORSAllowedOrigins = cleanList(c.CORSAllowedOrigins)
	if c.CORSAllowedOrigins == nil && c.Embedded() {
		c.CORSAllowedOrigins = []string{CORSAnyOrigin}
	}
	if c.ConnectionPoolSize == 0 {
		c.ConnectionPoolSize = defaultPoolSize
		if c.Embedded() {
			c.ConnectionPoolSize = defaultEmbeddedPoolSize
		}
	}
	if c.PoolBackend == "" {
		c.PoolBackend = PoolBackendRedis
		if c.Embedded() {
			c.PoolBackend = PoolBackendLocal
		}
	}
	c.YAMLUpstreams = yamlUpstreams
	if c.LLMProvider == ProviderOpenAI {
		// The upstream list is resolved here, where the environment is at
		// hand for each upstream's api_key_env; Validate reports its
		// problems with the other settings'.
		ups, err := upstream.Parse(c.LLMBaseURL, c.YAMLUpstreams, upstream.Defaults{
			APIKey: c.LLMAPIKey, MaxConcurrency: c.LLMUpstreamMaxConcurrency,
			LookupEnv: func(k string) (string, bool) { v, ok := environ[k]; return v, ok },
		})
		if err != nil {
			return nil, fmt.Errorf("config: %w", &FieldError{Var: "LLM_BASE_URL", Err: err})
		}
		c.Upstreams = ups
	}
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	return &c, nil
}

// environMap turns os.Environ's KEY=VALUE entries into a map. Entries
// without a key (Windows keeps "=C:=C:\" style ones) are skipped.
func environMap(entries []string) map[string]string {
	m := make(map[string]string, len(entries))
	for _, e := range entries {
		k, v, _ := strings.Cut(e, "=")
		if k == "" {
			continue
		}
		m[k] = v
	}
	return m
}

// cleanList trims each item and drops empty ones, so "a:1, b:2," is two
// brokers; nil when nothing is left.
func cleanList(items []string) []string {
	var out []string
	for _, it := range items {
		if it = strings.TrimSpace(it); it != "" {
			out = append(out, it)
		}
	}
	return out
}

// envVars maps each Config field name to its env name, in field order.
var envVars = func() map[string]string {
	m := make(map[string]string)
	t := reflect.TypeFor[Config]()
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("env"), ",")
		if name != "" {
			m[f.Name] = name
		}
	}
	return m
}()

// knownVars is the set of env names Config reads.
var knownVars = func() map[string]bool {
	m := make(map[string]bool, len(envVars))
	for _, v := range envVars {
		m[v] = true
	}
	return m
}()

// durationUnits maps the ending of a duration setting's env name to the
// unit its value is counted in.
var durationUnits = []struct {
	suffix string
	unit   time.Duration
	name   string
}{
	{"_MS", time.Millisecond, "milliseconds"},
	{"_SECONDS", time.Second, "seconds"},
	{"_HOURS", time.Hour, "hours"},
}

// durationUnit returns the unit of the duration setting name, from the
// ending of its name.
func durationUnit(name string) (unit time.Duration, unitName string, ok bool) {
	for _, u := range durationUnits {
		if strings.HasSuffix(name, u.suffix) {
			return u.unit, u.name, true
		}
	}
	return 0, "", false
}

// durationFields maps the env name of each time.Duration field of Config
// to the field's index.
var durationFields = func() map[string]int {
	m := make(map[string]int)
	t := reflect.TypeFor[Config]()
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("env"), ",")
		if name == "" || f.Type != reflect.TypeFor[time.Duration]() {
			continue
		}
		if _, _, ok := durationUnit(name); !ok {
			panic("config: duration setting " + name + " must end in _MS, _SECONDS or _HOURS")
		}
		m[name] = i
	}
	return m
}()

// parseDurations sets c's duration settings that merged gives, each a whole
// number in the unit its name ends in, and returns merged without them for
// the env parser, which would read "30" as a Go duration and fail.
func parseDurations(c *Config, merged, source map[string]string) (map[string]string, error) {
	rest := make(map[string]string, len(merged))
	rv := reflect.ValueOf(c).Elem()
	var errs []error
	for _, k := range slices.Sorted(maps.Keys(merged)) {
		val := merged[k]
		i, ok := durationFields[k]
		if !ok {
			rest[k] = val
			continue
		}
		if val == "" { // a YAML null or "": not set, as for every setting
			continue
		}
		unit, unitName, _ := durationUnit(k)
		n, err := strconv.ParseInt(strings.TrimSpace(val), 10, 64)
		switch {
		case err != nil:
			errs = append(errs, &FieldError{Var: k, Err: fmt.Errorf("(%s) is not a whole number of %s: %q", source[k], unitName, val)})
			continue
		case n > int64(math.MaxInt64/unit) || n < int64(math.MinInt64/unit):
			errs = append(errs, &FieldError{Var: k, Err: fmt.Errorf("(%s) is too large a number of %s: %q", source[k], unitName, val)})
			continue
		}
		rv.Field(i).SetInt(n * int64(unit))
	}
	return rest, errors.Join(errs...)
}

// nameParseErrors rewrites caarlos0/env's parse errors, which name the Go
// field, into FieldErrors that name the env var and where its value came from.
func nameParseErrors(err error, source map[string]string) error {
	var agg env.AggregateError
	if !errors.As(err, &agg) {
		return err
	}
	errs := make([]error, 0, len(agg.Errors))
	for _, e := range agg.Errors {
		var pe env.ParseError
		name, ok := "", false
		if errors.As(e, &pe) {
			name, ok = envVars[pe.Name]
		}
		if !ok {
			errs = append(errs, e)
			continue
		}
		typ := pe.Type
		if typ.Kind() == reflect.Pointer {
			typ = typ.Elem()
		}
		if typ.Kind() == reflect.Slice {
			typ = typ.Elem()
		}
		errs = append(errs, &FieldError{Var: name, Err: fmt.Errorf("(%s) is not a valid %s: %w", source[name], typ, pe.Err)})
	}
	return errors.Join(errs...)
}

// readFile reads a YAML settings file into env-style KEY=value pairs, and
// its `upstreams:` list, the one key that is not a setting.
func readFile(path string) (map[string]string, []upstream.Spec, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("read settings file: %w", err)
	}
	vals, err := parseYAML(data)
	if err != nil {
		return nil, nil, fmt.Errorf("settings file %s: %w", path, err)
	}
	ups, err := parseYAMLUpstreams(data)
	if err != nil {
		return nil, nil, fmt.Errorf("settings file %s: %w", path, err)
	}
	return vals, ups, nil
}

// yamlUpstreamsKey is the settings file's list of upstreams (docs/UPSTREAMS.md).
const yamlUpstreamsKey = "upstreams"

// parseYAMLUpstreams decodes the file's `upstreams:` list, refusing keys
// an upstream does not have, so a typo is not silently ignored.
func parseYAMLUpstreams(data []byte) ([]upstream.Spec, error) {
	var doc struct {
		Upstreams yaml.Node `yaml:"upstreams"`
	}
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, err
	}
	n := doc.Upstreams
	if n.Kind == 0 || n.Tag == "!!null" {
		return nil, nil
	}
	if n.Kind != yaml.SequenceNode {
		return nil, fmt.Errorf("line %d: upstreams must be a list", n.Line)
	}
	known := map[string]bool{"name": true, "base_url": true, "api_key_env": true, "weight": true,
		"max_concurrency": true, "rpm": true, "tpm": true, "models": true}
	var errs []error
	for _, item := range n.Content {
		if item.Kind != yaml.MappingNode {
			errs = append(errs, fmt.Errorf("line %d: each upstream must be a mapping", item.Line))
			continue
		}
		for i := 0; i+1 < len(item.Content); i += 2 {
			if k := item.Content[i]; !known[k.Value] {
				errs = append(errs, fmt.Errorf("line %d: unknown upstream key %q", k.Line, k.Value))
			}
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	var ups []upstream.Spec
	if err := n.Decode(&ups); err != nil {
		return nil, fmt.Errorf("upstreams: %w", err)
	}
	return ups, nil
}

// parseYAML decodes a mapping of lower-case env names to scalars or lists of
// scalars. Scalars keep their source text, so `0.10` or `1e3` reach the env
// parser exactly as written. Every bad key is reported, not just the first.
func parseYAML(data []byte) (map[string]string, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, err
	}
	vals := make(map[string]string)
	if doc.Kind == 0 { // empty file or only comments
		return vals, nil
	}
	root := doc.Content[0]
	if root.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("line %d: top level must be a mapping of setting names to values", root.Line)
	}
	var errs []error
	seen := make(map[string]bool)
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		key := k.Value
		name := strings.ToUpper(key)
		switch {
		case k.Kind != yaml.ScalarNode:
			errs = append(errs, fmt.Errorf("line %d: key must be a setting name", k.Line))
			continue
		case key == yamlUpstreamsKey:
			continue // parseYAMLUpstreams reads it
		case !knownVars[name] || key != strings.ToLower(key):
			if knownVars[name] {
				errs = append(errs, fmt.Errorf("line %d: unknown key %q (keys are lower case: %q)", k.Line, key, strings.ToLower(key)))
			} else {
				errs = append(errs, fmt.Errorf("line %d: unknown key %q", k.Line, key))
			}
			continue
		case seen[name]:
			errs = append(errs, fmt.Errorf("line %d: key %q given twice", k.Line, key))
			continue
		}
		seen[name] = true
		s, err := yamlValue(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("line %d: %s: %w", v.Line, key, err))
			continue
		}
		vals[name] = s
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return vals, nil
}

// yamlValue renders a YAML value the way it would be written in env: a
// scalar as is, null as empty (not set), a list joined by commas.
func yamlValue(n *yaml.Node) (string, error) {
	if n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	switch n.Kind {
	case yaml.ScalarNode:
		if n.Tag == "!!null" {
			return "", nil
		}
		return n.Value, nil
	case yaml.SequenceNode:
		items := make([]string, 0, len(n.Content))
		for _, it := range n.Content {
			if it.Kind == yaml.AliasNode {
				it = it.Alias
			}
			if it.Kind != yaml.ScalarNode || it.Tag == "!!null" {
				return "", errors.New("list items must be plain values")
			}
			if strings.Contains(it.Value, ",") {
				return "", fmt.Errorf("list item %q contains a comma, which separates items", it.Value)
			}
			items = append(items, it.Value)
		}
		return strings.Join(items, ","), nil
	default:
		return "", errors.New("value must be a plain value or a list")
	}
}
