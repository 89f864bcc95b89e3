package upstream

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"

	"github.com/spillway-dev/spillway/internal/redact"
)

// MaxUpstreams bounds how many upstreams one process may front. Routers
// keep eligibility in a 64-bit mask, which keeps a pick free of
// allocations; a fleet larger than this belongs behind its own balancer.
const MaxUpstreams = 64

// Spec is one upstream as configured: an entry of the YAML `upstreams:`
// list, or one URL of a comma-separated LLM_BASE_URL.
type Spec struct {
	// Name identifies the upstream in metrics, logs and Redis keys. In the
	// comma form it is the URL's host:port.
	Name string `yaml:"name"`
	// BaseURL is the API root including its version segment, such as
	// http://10.0.0.7:8000/v1.
	BaseURL string `yaml:"base_url"`
	// APIKeyEnv names the environment variable holding this upstream's API
	// key. Empty means no key is sent: a key is never shared with an
	// upstream by accident; write `api_key_env: LLM_API_KEY` to share it.
	APIKeyEnv string `yaml:"api_key_env"`
	// APIKey is the key itself, resolved by Parse (from APIKeyEnv, or
	// LLM_API_KEY in the comma form). Never read from YAML.
	APIKey string `yaml:"-"`
	// Weight is the upstream's share under the weighted router and its
	// capacity unit under least-loaded and affinity. Default 1.
	Weight int `yaml:"weight"`
	// MaxConcurrency caps the calls in flight on this upstream across the
	// whole cluster. 0 means only the global pool bounds it.
	MaxConcurrency int `yaml:"max_concurrency"`
	// RPM and TPM are the provider's requests and tokens per minute for
	// this upstream, cluster-wide. 0 means no quota.
	RPM int `yaml:"rpm"`
	TPM int `yaml:"tpm"`
	// Models lists the models this upstream serves. Empty means any.
	Models []string `yaml:"models"`
}

// Serves reports whether s takes requests for model. An empty model (the
// request names none) goes anywhere.
func (s Spec) Serves(model string) bool {
	if len(s.Models) == 0 || model == "" {
		return true
	}
	for _, m := range s.Models {
		if m == model {
			return true
		}
	}
	return false
}

// Defaults are the settings that apply to every upstream of the comma form,
// and the environment Parse reads api_key_env from.
type Defaults struct {
	// APIKey is LLM_API_KEY, shared by every URL of the comma form.
	APIKey string
	// MaxConcurrency is LLM_UPSTREAM_MAX_CONCURRENCY, each URL's cap in the
	// comma form.
	MaxConcurrency int
	// LookupEnv resolves api_key_env. Nil means no variable is set.
	LookupEnv func(string) (string, bool)
}

// Parse builds the upstream list from LLM_BASE_URL (list, possibly a comma
// list) or the YAML `upstreams:` entries, never both. It returns nil and no
// error when neither is given. Every problem found is reported at once, each
// naming the setting and the entry. It does not change yamlUpstreams.
//
// A list with a single URL is one upstream named by its host:port, so
// today's single LLM_BASE_URL keeps working unchanged.
func Parse(list string, yamlUpstreams []Spec, d Defaults) ([]Spec, error) {
	list = strings.TrimSpace(list)
	if list != "" && len(yamlUpstreams) > 0 {
		return nil, errors.New("upstreams: LLM_BASE_URL and the YAML upstreams list are both set; give one of them")
	}
	var (
		specs   []Spec
		entries []int // 1-based position of each spec in its list
		errs    []error
	)
	switch {
	case list != "":
		if d.MaxConcurrency < 0 {
			errs = append(errs, fmt.Errorf("LLM_UPSTREAM_MAX_CONCURRENCY (%d) must not be negative", d.MaxConcurrency))
		}
		for i, raw := range strings.Split(list, ",") {
			raw = strings.TrimSpace(raw)
			where := fmt.Sprintf("LLM_BASE_URL entry %d", i+1)
			if raw == "" {
				errs = append(errs, fmt.Errorf("%s is empty", where))
				continue
			}
			u, err := checkURL(raw)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s %q %w", where, redact.URL(raw), err))
				continue
			}
			specs = append(specs, Spec{
				Name:           hostPort(u),
				BaseURL:        raw,
				APIKey:         d.APIKey,
				Weight:         1,
				MaxConcurrency: max(d.MaxConcurrency, 0),
			})
			entries = append(entries, i+1)
		}
	case len(yamlUpstreams) > 0:
		for i, s := range yamlUpstreams {
			s.Models = append([]string(nil), s.Models...)
			where := fmt.Sprintf("upstreams[%d]", i)
			if s.Name != "" {
				where += fmt.Sprintf(" (%s)", s.Name)
			}
			if s.Weight == 0 {
				s.Weight = 1
			}
			s.Name = strings.TrimSpace(s.Name)
			if s.Name == "" {
				errs = append(errs, fmt.Errorf("%s: name is required", where))
			} else if strings.ContainsAny(s.Name, "{}\r\n\t ") {
				errs = append(errs, fmt.Errorf("%s: name %q must not contain braces or white space", where, s.Name))
			}
			if _, err := checkURL(s.BaseURL); err != nil {
				errs = append(errs, fmt.Errorf("%s: base_url %q %w", where, redact.URL(s.BaseURL), err))
			}
			if s.Weight < 1 {
				errs = append(errs, fmt.Errorf("%s: weight (%d) must be at least 1", where, s.Weight))
			}
			if s.MaxConcurrency < 0 {
				errs = append(errs, fmt.Errorf("%s: max_concurrency (%d) must not be negative", where, s.MaxConcurrency))
			}
			if s.RPM < 0 {
				errs = append(errs, fmt.Errorf("%s: rpm (%d) must not be negative", where, s.RPM))
			}
			if s.TPM < 0 {
				errs = append(errs, fmt.Errorf("%s: tpm (%d) must not be negative", where, s.TPM))
			}
			for _, m := range s.Models {
				if strings.TrimSpace(m) == "" {
					errs = append(errs, fmt.Errorf("%s: models has an empty entry", where))
					break
				}
			}
			if s.APIKeyEnv != "" {
				v, ok := "", false
				if d.LookupEnv != nil {
					v, ok = d.LookupEnv(s.APIKeyEnv)
				}
				if !ok {
					errs = append(errs, fmt.Errorf("%s: api_key_env %s is not set", where, s.APIKeyEnv))
				}
				s.APIKey = v
			}
			specs = append(specs, s)
			entries = append(entries, i+1)
		}
	default:
		return nil, nil
	}
	if len(specs) > MaxUpstreams {
		errs = append(errs, fmt.Errorf("%d upstreams are more than the %d supported", len(specs), MaxUpstreams))
	}
	names := make(map[string]int, len(specs))
	urls := make(map[string]int, len(specs))
	for i, s := range specs {
		if j, dup := names[s.Name]; dup && s.Name != "" {
			errs = append(errs, fmt.Errorf("upstream name %q is used by entries %d and %d", s.Name, entries[j], entries[i]))
		} else {
			names[s.Name] = i
		}
		key := strings.TrimRight(s.BaseURL, "/")
		if j, dup := urls[key]; dup && key != "" {
			errs = append(errs, fmt.Errorf("upstream base URL %q is used by entries %d and %d", redact.URL(s.BaseURL), entries[j], entries[i]))
		} else {
			urls[key] = i
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("upstreams: %w", err)
	}
	return specs, nil
}

// checkURL accepts an absolute http or https URL with a host. Its error
// reads after the value it judged.
func checkURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	switch {
	case raw == "":
		return nil, errors.New("is empty")
	case err != nil:
		return nil, errors.New("is not a URL")
	case u.Scheme != "http" && u.Scheme != "https":
		return nil, errors.New("must start with http:// or https://")
	case u.Host == "" || u.Hostname() == "":
		return nil, errors.New("has no host")
	}
	return u, nil
}

// hostPort names an upstream of the comma form: its host and port, the
// port filled in from the scheme when the URL omits it.
func hostPort(u *url.URL) string {
	if u.Port() != "" {
		return u.Host
	}
	port := "80"
	if u.Scheme == "https" {
		port = "443"
	}
	return net.JoinHostPort(u.Hostname(), port)
}
