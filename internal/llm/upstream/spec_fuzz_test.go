package upstream

import (
	"net/url"
	"testing"
)

// FuzzParse feeds LLM_BASE_URL values: Parse must never panic, and what it
// accepts must be usable (http/https URLs with a host, unique names).
func FuzzParse(f *testing.F) {
	for _, s := range []string{"http://127.0.0.1:8081/v1", "http://a:1/v1,https://b/v1", "http://a/v1,,", "ftp://x", "http://[::1]:80/v1", "http://%zz"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, list string) {
		specs, err := Parse(list, nil, Defaults{MaxConcurrency: 2})
		if err != nil {
			return
		}
		names := map[string]bool{}
		for _, s := range specs {
			u, perr := url.Parse(s.BaseURL)
			if perr != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "" {
				t.Fatalf("accepted bad URL %q", s.BaseURL)
			}
			if names[s.Name] || s.Weight != 1 || s.MaxConcurrency != 2 {
				t.Fatalf("bad spec %+v", s)
			}
			names[s.Name] = true
		}
	})
}
