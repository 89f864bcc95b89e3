package deploy_test

import (
	"bytes"
	"fmt"
	"io/fs"
	"net/url"
	"path"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
)

// composeFile is the subset of the Compose specification docker-compose.yml
// uses. It is decoded with unknown fields refused, so a misspelt key (or
// one this check does not understand yet) fails instead of being ignored.
type composeFile struct {
	Services map[string]*composeService `yaml:"services"`
	Volumes  map[string]*struct{}       `yaml:"volumes"`
	Networks map[string]*struct{}       `yaml:"networks"`
	// Extensions holds the top-level x-* keys (YAML anchors to share).
	Extensions map[string]yaml.Node `yaml:",inline"`
}

type composeService struct {
	Image           string               `yaml:"image"`
	Build           string               `yaml:"build"`
	Command         stringOrList         `yaml:"command"`
	Entrypoint      stringOrList         `yaml:"entrypoint"`
	Environment     map[string]*string   `yaml:"environment"`
	Ports           []string             `yaml:"ports"`
	Expose          []string             `yaml:"expose"`
	Volumes         []string             `yaml:"volumes"`
	DependsOn       dependsOn            `yaml:"depends_on"`
	Profiles        []string             `yaml:"profiles"`
	Healthcheck     *composeHealthcheck  `yaml:"healthcheck"`
	Restart         string               `yaml:"restart"`
	Ulimits         map[string]ulimitVal `yaml:"ulimits"`
	StopGracePeriod string               `yaml:"stop_grace_period"`
	Networks        []string             `yaml:"networks"`
}

type composeHealthcheck struct {
	Test        []string `yaml:"test"`
	Interval    string   `yaml:"interval"`
	Timeout     string   `yaml:"timeout"`
	Retries     int      `yaml:"retries"`
	StartPeriod string   `yaml:"start_period"`
}

// stringOrList is a command: a string or a list of strings.
type stringOrList []string

func (s *stringOrList) UnmarshalYAML(n *yaml.Node) error {
	switch n.Kind {
	case yaml.ScalarNode:
		*s = strings.Fields(n.Value)
		return nil
	case yaml.SequenceNode:
		var l []string
		if err := n.Decode(&l); err != nil {
			return err
		}
		*s = l
		return nil
	}
	return fmt.Errorf("line %d: want a string or a list of strings", n.Line)
}

// dependency is one depends_on entry in its long form.
type dependency struct {
	Condition string
	Required  bool
}

// dependsOn accepts the short (list) and long (map) forms.
type dependsOn map[string]dependency

func (d *dependsOn) UnmarshalYAML(n *yaml.Node) error {
	out := dependsOn{}
	switch n.Kind {
	case yaml.SequenceNode:
		for _, c := range n.Content {
			out[c.Value] = dependency{Condition: "service_started", Required: true}
		}
	case yaml.MappingNode:
		for i := 0; i < len(n.Content); i += 2 {
			name, v := n.Content[i].Value, n.Content[i+1]
			dep := dependency{Condition: "service_started", Required: true}
			if v.Kind != yaml.MappingNode {
				return fmt.Errorf("line %d: depends_on %s: want a mapping", v.Line, name)
			}
			for j := 0; j < len(v.Content); j += 2 {
				k, val := v.Content[j].Value, v.Content[j+1]
				switch k {
				case "condition":
					dep.Condition = val.Value
				case "required":
					if err := val.Decode(&dep.Required); err != nil {
						return fmt.Errorf("line %d: depends_on %s required: %w", val.Line, name, err)
					}
				case "restart":
				default:
					return fmt.Errorf("line %d: depends_on %s: unknown field %q", val.Line, name, k)
				}
			}
			out[name] = dep
		}
	default:
		return fmt.Errorf("line %d: depends_on: want a list or a mapping", n.Line)
	}
	*d = out
	return nil
}

// ulimitVal is a number or {soft, hard}.
type ulimitVal struct{ Soft, Hard int }

func (u *ulimitVal) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		var v int
		if err := n.Decode(&v); err != nil {
			return err
		}
		u.Soft, u.Hard = v, v
		return nil
	}
	var m map[string]int
	if err := n.Decode(&m); err != nil {
		return err
	}
	for k, v := range m {
		switch k {
		case "soft":
			u.Soft = v
		case "hard":
			u.Hard = v
		default:
			return fmt.Errorf("line %d: ulimit: unknown field %q", n.Line, k)
		}
	}
	return nil
}

var interpRe = regexp.MustCompile(`\$(\$|\{([A-Za-z_][A-Za-z0-9_]*)((:?-)([^}]*))?\}|.|$)`)

// interpolate applies Compose's variable substitution for the forms the
// file uses (${VAR}, ${VAR-default}, ${VAR:-default}, $$) and refuses
// others, so a form this check cannot evaluate fails rather than passes.
// It returns the variables referenced.
func interpolate(src string, environ map[string]string) (string, map[string]bool, error) {
	used := map[string]bool{}
	var bad []string
	out := interpRe.ReplaceAllStringFunc(src, func(m string) string {
		g := interpRe.FindStringSubmatch(m)
		if g[1] == "$" {
			return "$"
		}
		if g[2] == "" {
			bad = append(bad, m)
			return m
		}
		used[g[2]] = true
		v, set := environ[g[2]]
		switch g[4] {
		case "-":
			if !set {
				return g[5]
			}
		case ":-":
			if v == "" {
				return g[5]
			}
		}
		return v
	})
	if len(bad) > 0 {
		return "", nil, fmt.Errorf("unsupported interpolation %q (use ${VAR}, ${VAR-default}, ${VAR:-default} or $$)", bad)
	}
	return out, used, nil
}

// readEnvFile parses a Compose --env-file: KEY=VALUE lines and comments.
func readEnvFile(b []byte) (map[string]string, error) {
	env := map[string]string{}
	for i, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok || !regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`).MatchString(k) {
			return nil, fmt.Errorf("line %d: want KEY=VALUE, got %q", i+1, line)
		}
		env[k] = v
	}
	return env, nil
}

func decodeCompose(src string, environ map[string]string) (*composeFile, map[string]bool, error) {
	text, used, err := interpolate(src, environ)
	if err != nil {
		return nil, nil, err
	}
	var f composeFile
	dec := yaml.NewDecoder(strings.NewReader(text))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil {
		return nil, nil, fmt.Errorf("decoding: %w", err)
	}
	return &f, used, nil
}

// spillwayProcess names the Spillway binary a service runs (the image's
// command), or "" for a service of another image.
func spillwayProcess(s *composeService) string {
	if s.Build == "" || len(s.Command) == 0 {
		return ""
	}
	return s.Command[0]
}

// listenPort is the port a Spillway service listens on, from its settings.
func listenPort(s *composeService) string {
	env := func(k, def string) string {
		if v := s.Environment[k]; v != nil && *v != "" {
			return *v
		}
		return def
	}
	switch spillwayProcess(s) {
	case "api":
		return portOf(env("HTTP_ADDR", ":8080"))
	case "consumer":
		return portOf(env("CONSUMER_HTTP_ADDR", ":9090"))
	case "simllm":
		for i, a := range s.Command {
			if a == "-addr" && i+1 < len(s.Command) {
				return portOf(s.Command[i+1])
			}
		}
		return portOf(env("HTTP_ADDR", ":8081"))
	}
	return ""
}

// servicePorts are the ports a service answers on inside the network.
func servicePorts(s *composeService) map[string]bool {
	ps := map[string]bool{}
	if p := listenPort(s); p != "" {
		ps[p] = true
	}
	for _, e := range s.Expose {
		ps[e] = true
	}
	return ps
}

var profileRe = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]*$`)

// checkCompose validates docker-compose.yml with environ as the host
// environment (an --env-file's contents).
func checkCompose(fsys fs.FS, environ map[string]string, label string) error {
	var e errs
	raw, err := fs.ReadFile(fsys, "docker-compose.yml")
	if err != nil {
		return err
	}
	f, _, err := decodeCompose(string(raw), environ)
	if err != nil {
		return fmt.Errorf("docker-compose.yml (%s): %w", label, err)
	}
	where := func(svc string) string { return fmt.Sprintf("docker-compose.yml (%s): service %s", label, svc) }
	for k := range f.Extensions {
		if !strings.HasPrefix(k, "x-") {
			e.add("docker-compose.yml: unknown top-level key %q", k)
		}
	}
	if len(f.Services) == 0 {
		e.add("docker-compose.yml: no services")
	}
	usedVolumes := map[string]bool{}
	hostPorts := map[string]string{}
	profiles := map[string]bool{}
	for name, s := range f.Services {
		w := where(name)
		if s == nil {
			e.add("%s: empty", w)
			continue
		}
		if (s.Image == "") == (s.Build == "") {
			e.add("%s: needs exactly one of image and build", w)
		}
		if s.Build != "" {
			if _, err := fs.Stat(fsys, path.Join(path.Clean(s.Build), "Dockerfile")); err != nil {
				e.add("%s: build context %s has no Dockerfile", w, s.Build)
			}
		}
		for _, p := range s.Profiles {
			if !profileRe.MatchString(p) {
				e.add("%s: bad profile name %q", w, p)
			}
			profiles[p] = true
		}
		// depends_on: the target exists, the condition is one Compose knows
		// and can be met, and a target that may be switched off by a profile
		// is optional.
		for dep, d := range s.DependsOn {
			t, ok := f.Services[dep]
			if !ok {
				e.add("%s: depends_on unknown service %s", w, dep)
				continue
			}
			switch d.Condition {
			case "service_started":
			case "service_healthy":
				if t.Healthcheck == nil {
					e.add("%s: depends_on %s being healthy, but %s has no healthcheck", w, dep, dep)
				}
			case "service_completed_successfully":
				if t.Restart != "no" {
					e.add("%s: waits for %s to complete, but %s is not a one-shot (restart: \"no\")", w, dep, dep)
				}
			default:
				e.add("%s: depends_on %s: unknown condition %q", w, dep, d.Condition)
			}
			if d.Required && !profilesCover(t.Profiles, s.Profiles) {
				e.add("%s: depends_on %s, which only runs with profiles %v: mark it required: false", w, dep, t.Profiles)
			}
		}
		for _, v := range s.Volumes {
			parts := strings.Split(v, ":")
			if len(parts) < 2 || len(parts) > 3 || !strings.HasPrefix(parts[1], "/") {
				e.add("%s: volume %q: want source:/container/path[:ro|rw]", w, v)
				continue
			}
			if len(parts) == 3 && parts[2] != "ro" && parts[2] != "rw" {
				e.add("%s: volume %q: mode %q", w, v, parts[2])
			}
			src := parts[0]
			if strings.HasPrefix(src, "./") || strings.HasPrefix(src, "../") {
				if _, err := fs.Stat(fsys, path.Clean(src)); err != nil {
					e.add("%s: volume source %s does not exist in the repository", w, src)
				}
				continue
			}
			if _, ok := f.Volumes[src]; !ok {
				e.add("%s: named volume %s is not declared under volumes", w, src)
			}
			usedVolumes[src] = true
		}
		for _, n := range s.Networks {
			if _, ok := f.Networks[n]; !ok {
				e.add("%s: network %s is not declared under networks", w, n)
			}
		}
		for _, p := range s.Expose {
			if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
				e.add("%s: expose %q is not a port", w, p)
			}
		}
		for _, p := range s.Ports {
			host, ctr, ok := strings.Cut(p, ":")
			hn, err1 := strconv.Atoi(host)
			cn, err2 := strconv.Atoi(ctr)
			if !ok || err1 != nil || err2 != nil || hn < 1 || hn > 65535 || cn < 1 || cn > 65535 {
				e.add("%s: port %q: want HOST:CONTAINER", w, p)
				continue
			}
			if other, dup := hostPorts[host]; dup {
				e.add("%s: host port %s already taken by %s", w, host, other)
			}
			hostPorts[host] = name
			if lp := listenPort(s); lp != "" && lp != ctr {
				e.add("%s: port %q maps %s, but the process listens on %s", w, p, ctr, lp)
			}
		}
		if s.StopGracePeriod != "" {
			if _, err := time.ParseDuration(s.StopGracePeriod); err != nil {
				e.add("%s: stop_grace_period %q: %v", w, s.StopGracePeriod, err)
			}
		}
		checkSpillwayService(&e, f, name, s, w)
	}
	for v := range f.Volumes {
		if !usedVolumes[v] {
			e.add("docker-compose.yml: volume %s is declared but no service mounts it", v)
		}
	}
	// Every profile is documented.
	if doc, err := fs.ReadFile(fsys, "docs/DEPLOY.md"); err != nil {
		e.add("docs/DEPLOY.md: %v", err)
	} else {
		for p := range profiles {
			if !strings.Contains(string(doc), "--profile "+p) {
				e.add("docker-compose.yml: profile %s is not explained in docs/DEPLOY.md (no \"--profile %s\")", p, p)
			}
		}
	}
	checkNginx(&e, fsys, f)
	checkPrometheus(&e, fsys, f)
	checkGrafanaProvisioning(&e, fsys, f)
	return e.err()
}

// profilesCover reports whether a service with profiles target always runs
// when one with profiles of runs.
func profilesCover(target, of []string) bool {
	if len(target) == 0 {
		return true
	}
	if len(of) == 0 {
		return false
	}
	for _, p := range of {
		found := false
		for _, t := range target {
			found = found || t == p
		}
		if !found {
			return false
		}
	}
	return true
}

// checkSpillwayService checks the api, consumer and simllm services: the
// settings they are given, that scalable tiers have no host port, that
// hosts they name are services, and the stop grace period.
func checkSpillwayService(e *errs, f *composeFile, name string, s *composeService, w string) {
	proc := spillwayProcess(s)
	switch proc {
	case "":
		return
	case "api", "consumer", "simllm":
	default:
		e.add("%s: runs unknown Spillway command %q", w, proc)
		return
	}
	env := map[string]string{}
	for k, v := range s.Environment {
		checkEnvName(e, w, k)
		if v != nil {
			env[k] = *v
		}
	}
	if proc == "simllm" {
		return
	}
	if len(s.Ports) > 0 {
		e.add("%s: scales with --scale, so it must not publish host ports (replicas would collide): %v", w, s.Ports)
	}
	if _, err := loadConfig(env); err != nil {
		e.add("%s: its settings do not pass Spillway's validation: %v", w, err)
	}
	for _, k := range []string{"REDIS_URL", "LLM_BASE_URL", "OTEL_EXPORTER_OTLP_ENDPOINT"} {
		if v := env[k]; v != "" {
			checkHostIsService(e, f, w, k, v)
		}
	}
	for _, k := range []string{"KAFKA_BROKERS", "REDIS_CLUSTER_ADDRS"} {
		for _, a := range strings.Split(env[k], ",") {
			if a = strings.TrimSpace(a); a != "" {
				checkHostIsService(e, f, w, k, a)
			}
		}
	}
	grace := 25
	if v := env["SHUTDOWN_GRACE_SECONDS"]; v != "" {
		grace, _ = strconv.Atoi(v)
	}
	d, err := time.ParseDuration(s.StopGracePeriod)
	if err != nil || d <= time.Duration(grace)*time.Second {
		e.add("%s: stop_grace_period %q must exceed SHUTDOWN_GRACE_SECONDS (%ds), or `docker compose stop` kills streams mid-drain", w, s.StopGracePeriod, grace)
	}
}

// checkHostIsService reports a host that is no service of the file (the
// value would not resolve inside the Compose network) and a port the
// service does not answer on.
func checkHostIsService(e *errs, f *composeFile, w, key, value string) {
	host := hostOf(value)
	t, ok := f.Services[host]
	if !ok {
		e.add("%s: %s names host %q, which is no service", w, key, host)
		return
	}
	port := portOf(value)
	if strings.Contains(value, "://") {
		if u, err := url.Parse(value); err == nil {
			port = u.Port()
		}
	}
	if port != "" && len(servicePorts(t)) > 0 && !servicePorts(t)[port] {
		e.add("%s: %s names %s:%s, but %s answers on %v", w, key, host, port, host, sortedKeys(servicePorts(t)))
	}
}

// mountedFile maps a container path of service s back to the repository
// file mounted there, or "".
func mountedFile(s *composeService, containerPath string) string {
	for _, v := range s.Volumes {
		parts := strings.Split(v, ":")
		if len(parts) < 2 || !strings.HasPrefix(parts[0], ".") {
			continue
		}
		src, dst := path.Clean(parts[0]), path.Clean(parts[1])
		if containerPath == dst {
			return src
		}
		if rel, ok := strings.CutPrefix(containerPath, dst+"/"); ok {
			return path.Join(src, rel)
		}
	}
	return ""
}

// serviceByImage returns the one service whose image starts with prefix.
func serviceByImage(f *composeFile, prefix string) (string, *composeService) {
	for n, s := range f.Services {
		if strings.HasPrefix(s.Image, prefix) {
			return n, s
		}
	}
	return "", nil
}

var (
	nginxUpstreamRe = regexp.MustCompile(`(?s)upstream\s+([A-Za-z0-9_]+)\s*\{(.*?)\n\s*\}`)
	nginxServerRe   = regexp.MustCompile(`(?m)^\s*server\s+([^\s;:]+):(\d+)([^;]*);`)
	nginxPassRe     = regexp.MustCompile(`proxy_pass\s+http://([A-Za-z0-9_.-]+)`)
	nginxDirRe      = func(d string) *regexp.Regexp { return regexp.MustCompile(`(?m)^\s*` + d + `\s+([^;]+);`) }
)

// checkNginx checks the nginx service's mounted configuration: proxy_pass
// names an upstream, upstream servers are services on their listening
// port, DNS re-resolution is wired, and the SSE settings are in place.
func checkNginx(e *errs, fsys fs.FS, f *composeFile) {
	name, s := serviceByImage(f, "nginx:")
	if s == nil {
		e.add("docker-compose.yml: no nginx service")
		return
	}
	src := mountedFile(s, "/etc/nginx/nginx.conf")
	if src == "" {
		e.add("docker-compose.yml: service %s does not mount a configuration at /etc/nginx/nginx.conf", name)
		return
	}
	b, err := fs.ReadFile(fsys, src)
	if err != nil {
		e.add("%s: %v", src, err)
		return
	}
	conf := regexp.MustCompile(`(?m)#.*$`).ReplaceAllString(string(b), "")
	upstreams := map[string]string{}
	for _, m := range nginxUpstreamRe.FindAllStringSubmatch(conf, -1) {
		upstreams[m[1]] = m[2]
	}
	passes := nginxPassRe.FindAllStringSubmatch(conf, -1)
	if len(passes) == 0 {
		e.add("%s: no proxy_pass", src)
	}
	for _, p := range passes {
		body, ok := upstreams[p[1]]
		if !ok {
			e.add("%s: proxy_pass to %s, which is no upstream block", src, p[1])
			continue
		}
		servers := nginxServerRe.FindAllStringSubmatch(body, -1)
		if len(servers) == 0 {
			e.add("%s: upstream %s has no server", src, p[1])
		}
		for _, sv := range servers {
			t, ok := f.Services[sv[1]]
			if !ok {
				e.add("%s: upstream %s names %s, which is no service of docker-compose.yml", src, p[1], sv[1])
				continue
			}
			if !servicePorts(t)[sv[2]] {
				e.add("%s: upstream %s names %s:%s, but %s answers on %v", src, p[1], sv[1], sv[2], sv[1], sortedKeys(servicePorts(t)))
			}
			if strings.Contains(sv[3], "resolve") {
				if !strings.Contains(body, "zone ") {
					e.add("%s: upstream %s resolves %s but has no zone", src, p[1], sv[1])
				}
				if !nginxDirRe("resolver").MatchString(conf) {
					e.add("%s: upstream %s resolves %s but no resolver is set", src, p[1], sv[1])
				}
			} else if ps := f.Services[sv[1]]; ps != nil && spillwayProcess(ps) == "api" {
				e.add("%s: upstream %s names the scalable api without resolve: replicas added later are never used", src, p[1])
			}
		}
	}
	for _, want := range [][2]string{{"proxy_buffering", "off"}, {"proxy_http_version", "1.1"}, {"gzip", "off"}, {"proxy_cache", "off"}} {
		m := nginxDirRe(want[0]).FindStringSubmatch(conf)
		if m == nil || strings.TrimSpace(m[1]) != want[1] {
			e.add("%s: SSE needs %s %s", src, want[0], want[1])
		}
	}
	m := nginxDirRe("proxy_read_timeout").FindStringSubmatch(conf)
	if m == nil {
		e.add("%s: no proxy_read_timeout (the 60s default is close to queue waits)", src)
	} else if d, err := time.ParseDuration(strings.TrimSpace(m[1])); err != nil || d <= 15*time.Second {
		e.add("%s: proxy_read_timeout %s must exceed HEARTBEAT_INTERVAL_SECONDS (15s)", src, m[1])
	}
	hasEntry := false
	for _, p := range s.Ports {
		hasEntry = hasEntry || strings.HasPrefix(p, "8080:")
	}
	if !hasEntry {
		e.add("docker-compose.yml: nginx must be the entry on host port 8080, has %v", s.Ports)
	}
}

// prometheusConfig is the subset of Prometheus' configuration file used.
type prometheusConfig struct {
	Global struct {
		ScrapeInterval string `yaml:"scrape_interval"`
	} `yaml:"global"`
	RuleFiles     []string `yaml:"rule_files"`
	ScrapeConfigs []struct {
		JobName       string `yaml:"job_name"`
		MetricsPath   string `yaml:"metrics_path"`
		StaticConfigs []struct {
			Targets []string `yaml:"targets"`
		} `yaml:"static_configs"`
		DNSSDConfigs []struct {
			Names           []string `yaml:"names"`
			Type            string   `yaml:"type"`
			Port            int      `yaml:"port"`
			RefreshInterval string   `yaml:"refresh_interval"`
		} `yaml:"dns_sd_configs"`
	} `yaml:"scrape_configs"`
}

func strictYAML(b []byte, v any) error {
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	return dec.Decode(v)
}

// checkPrometheus checks the mounted prometheus.yml: rule files exist,
// every target is a service on its port, and api and consumer are found
// by DNS (every replica), not pinned.
func checkPrometheus(e *errs, fsys fs.FS, f *composeFile) {
	name, s := serviceByImage(f, "prom/prometheus:")
	if s == nil {
		e.add("docker-compose.yml: no prometheus service")
		return
	}
	cfgPath := "/etc/prometheus/prometheus.yml"
	for _, a := range s.Command {
		if v, ok := strings.CutPrefix(a, "--config.file="); ok {
			cfgPath = v
		}
	}
	src := mountedFile(s, cfgPath)
	if src == "" {
		e.add("docker-compose.yml: service %s does not mount %s", name, cfgPath)
		return
	}
	b, err := fs.ReadFile(fsys, src)
	if err != nil {
		e.add("%s: %v", src, err)
		return
	}
	var pc prometheusConfig
	if err := strictYAML(b, &pc); err != nil {
		e.add("%s: %v", src, err)
		return
	}
	for _, r := range pc.RuleFiles {
		rf := mountedFile(s, r)
		if _, err := fs.Stat(fsys, rf); rf == "" || err != nil {
			e.add("%s: rule file %s is not mounted from the repository", src, r)
		}
	}
	byDNS := map[string]bool{}
	jobs := map[string]bool{}
	for _, sc := range pc.ScrapeConfigs {
		if jobs[sc.JobName] {
			e.add("%s: job %s twice", src, sc.JobName)
		}
		jobs[sc.JobName] = true
		for _, st := range sc.StaticConfigs {
			for _, t := range st.Targets {
				checkScrapeTarget(e, f, src, sc.JobName, hostOf(t), portOf(t))
			}
		}
		for _, d := range sc.DNSSDConfigs {
			if d.Type != "A" {
				e.add("%s: job %s: dns_sd type %q, want A (Docker's DNS answers A records per replica)", src, sc.JobName, d.Type)
			}
			for _, n := range d.Names {
				checkScrapeTarget(e, f, src, sc.JobName, n, strconv.Itoa(d.Port))
				if t := f.Services[n]; t != nil {
					byDNS[spillwayProcess(t)] = true
				}
			}
		}
	}
	for _, p := range []string{"api", "consumer"} {
		if !byDNS[p] {
			e.add("%s: the %s replicas are not discovered by DNS (dns_sd_configs type A)", src, p)
		}
	}
}

func checkScrapeTarget(e *errs, f *composeFile, src, job, host, port string) {
	t, ok := f.Services[host]
	if !ok {
		e.add("%s: job %s scrapes %s, which is no service of docker-compose.yml", src, job, host)
		return
	}
	if !servicePorts(t)[port] {
		e.add("%s: job %s scrapes %s:%s, but %s answers on %v", src, job, host, port, host, sortedKeys(servicePorts(t)))
	}
}

// grafanaDatasources and grafanaProviders are Grafana's provisioning files.
type grafanaDatasources struct {
	APIVersion  int `yaml:"apiVersion"`
	Datasources []struct {
		Name      string         `yaml:"name"`
		UID       string         `yaml:"uid"`
		Type      string         `yaml:"type"`
		Access    string         `yaml:"access"`
		URL       string         `yaml:"url"`
		IsDefault bool           `yaml:"isDefault"`
		JSONData  map[string]any `yaml:"jsonData"`
	} `yaml:"datasources"`
}

type grafanaProviders struct {
	APIVersion int `yaml:"apiVersion"`
	Providers  []struct {
		Name            string `yaml:"name"`
		Folder          string `yaml:"folder"`
		Type            string `yaml:"type"`
		DisableDeletion bool   `yaml:"disableDeletion"`
		AllowUIUpdates  bool   `yaml:"allowUiUpdates"`
		Options         struct {
			Path string `yaml:"path"`
		} `yaml:"options"`
	} `yaml:"providers"`
}

// checkGrafanaProvisioning checks the grafana service: datasources point at
// services, the dashboard provider's folder is mounted from the repository
// and holds the dashboards, whose datasources are provisioned.
func checkGrafanaProvisioning(e *errs, fsys fs.FS, f *composeFile) {
	name, s := serviceByImage(f, "grafana/grafana:")
	if s == nil {
		e.add("docker-compose.yml: no grafana service")
		return
	}
	dir := mountedFile(s, "/etc/grafana/provisioning")
	if dir == "" {
		e.add("docker-compose.yml: service %s does not mount /etc/grafana/provisioning", name)
		return
	}
	uids := map[string]string{}
	dsFiles, _ := fs.Glob(fsys, path.Join(dir, "datasources", "*.yml"))
	if len(dsFiles) == 0 {
		e.add("%s/datasources: no datasource file", dir)
	}
	for _, p := range dsFiles {
		b, _ := fs.ReadFile(fsys, p)
		var ds grafanaDatasources
		if err := strictYAML(b, &ds); err != nil {
			e.add("%s: %v", p, err)
			continue
		}
		for _, d := range ds.Datasources {
			uids[d.UID] = d.Type
			host := hostOf(d.URL)
			if _, ok := f.Services[host]; !ok {
				e.add("%s: datasource %s points at %s, which is no service", p, d.Name, host)
				continue
			}
			// Prometheus and Jaeger listen on their images' own ports.
			known := map[string]string{"prometheus": "9090", "jaeger": "16686"}
			if want, ok := known[d.Type]; ok && !strings.HasSuffix(d.URL, ":"+want) {
				e.add("%s: datasource %s: %s answers on %s", p, d.Name, d.Type, want)
			}
		}
		for _, d := range ds.Datasources {
			if dests, ok := d.JSONData["exemplarTraceIdDestinations"].([]any); ok {
				for _, x := range dests {
					m, _ := x.(map[string]any)
					if uid, _ := m["datasourceUid"].(string); uids[uid] == "" {
						e.add("%s: exemplars of %s link to datasource %q, which is not provisioned", p, d.Name, uid)
					}
				}
			}
		}
	}
	pvFiles, _ := fs.Glob(fsys, path.Join(dir, "dashboards", "*.yml"))
	if len(pvFiles) == 0 {
		e.add("%s/dashboards: no dashboard provider file", dir)
	}
	dashboards := 0
	for _, p := range pvFiles {
		b, _ := fs.ReadFile(fsys, p)
		var pv grafanaProviders
		if err := strictYAML(b, &pv); err != nil {
			e.add("%s: %v", p, err)
			continue
		}
		for _, pr := range pv.Providers {
			src := mountedFile(s, pr.Options.Path)
			files, _ := fs.Glob(fsys, path.Join(src, "*.json"))
			if src == "" || len(files) == 0 {
				e.add("%s: provider %s reads %s, which holds no dashboard mounted from the repository", p, pr.Name, pr.Options.Path)
			}
			for _, df := range files {
				dashboards++
				b, _ := fs.ReadFile(fsys, df)
				if err := checkDashboard(b, uids); err != nil {
					e.add("%s: %v", df, err)
				}
			}
		}
	}
	if dashboards == 0 {
		e.add("grafana: no dashboard provisioned")
	}
}

// TestInterpolate pins the Compose substitution forms the checks evaluate.
func TestInterpolate(t *testing.T) {
	t.Parallel()
	env := map[string]string{"SET": "v", "EMPTY": ""}
	for _, c := range []struct{ in, want string }{
		{"${SET}", "v"}, {"${UNSET}", ""},
		{"${SET-d}", "v"}, {"${EMPTY-d}", ""}, {"${UNSET-d}", "d"},
		{"${SET:-d}", "v"}, {"${EMPTY:-d}", "d"}, {"${UNSET:-d}", "d"},
		{"$$x $${X}", "$x ${X}"}, {"a:${UNSET-redis://r:6379}", "a:redis://r:6379"},
	} {
		got, _, err := interpolate(c.in, env)
		if err != nil || got != c.want {
			t.Errorf("interpolate(%q) = %q, %v; want %q", c.in, got, err, c.want)
		}
	}
	for _, bad := range []string{"$X", "${X:?e}", "${X:+y}", "$"} {
		if _, _, err := interpolate(bad, env); err == nil {
			t.Errorf("interpolate(%q): no error", bad)
		}
	}
}
