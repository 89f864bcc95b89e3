package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Several upstreams: the comma list and the settings file's list resolve
// to the same kind of list, with keys looked up, and every way to get it
// wrong is refused at start with the setting's name.
func TestUpstreamsFromConfig(t *testing.T) {
	t.Parallel()
	c, err := Load("", map[string]string{"LLM_PROVIDER": "openai", "LLM_API_KEY": "sk-1",
		"LLM_BASE_URL": "http://10.0.0.7:8000/v1, http://10.0.0.8:8000/v1", "LLM_UPSTREAM_MAX_CONCURRENCY": "4"})
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Upstreams) != 2 || c.Upstreams[0].Name != "10.0.0.7:8000" || c.Upstreams[1].MaxConcurrency != 4 ||
		c.Upstreams[1].APIKey != "sk-1" || c.Upstreams[1].BaseURL != "http://10.0.0.8:8000/v1" {
		t.Fatalf("upstreams %+v", c.Upstreams)
	}

	dir := t.TempDir()
	file := filepath.Join(dir, "spillway.yaml")
	yaml := "llm_provider: openai\nupstreams:\n" +
		"  - {name: gpu-a, base_url: \"http://10.0.0.7:8000/v1\", weight: 2, max_concurrency: 16}\n" +
		"  - {name: spare, base_url: \"https://api.example.com/v1\", api_key_env: SPARE_KEY, rpm: 600, models: [m1]}\n"
	if err := os.WriteFile(file, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err = Load(file, map[string]string{"SPARE_KEY": "sk-spare"})
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Upstreams) != 2 || c.Upstreams[0].Weight != 2 || c.Upstreams[1].APIKey != "sk-spare" ||
		c.Upstreams[1].RPM != 600 || len(c.Upstreams[1].Models) != 1 {
		t.Fatalf("upstreams from file %+v", c.Upstreams)
	}

	bad := []struct {
		name, file string
		env        map[string]string
		want       string
	}{
		{"both forms", yaml, map[string]string{"LLM_BASE_URL": "http://h:1/v1", "SPARE_KEY": "k"}, "LLM_BASE_URL"},
		{"duplicate URL", "", map[string]string{"LLM_PROVIDER": "openai", "LLM_BASE_URL": "http://h:1/v1,http://h:1/v1"}, "LLM_BASE_URL"},
		{"bad URL in list", "", map[string]string{"LLM_PROVIDER": "openai", "LLM_BASE_URL": "http://h:1/v1,ftp://x"}, "LLM_BASE_URL"},
		{"routing", "", map[string]string{"LLM_ROUTING": "random"}, "LLM_ROUTING"},
		{"balance", "", map[string]string{"LLM_AFFINITY_BALANCE": "0.5"}, "LLM_AFFINITY_BALANCE"},
		{"fails", "", map[string]string{"LLM_UPSTREAM_MAX_FAILS": "0"}, "LLM_UPSTREAM_MAX_FAILS"},
		{"unknown upstream key", "llm_provider: openai\nupstreams:\n  - {name: a, base_url: \"http://h:1/v1\", wieght: 2}\n", nil, "wieght"},
		{"upstreams not a list", "llm_provider: openai\nupstreams: http://h:1/v1\n", nil, "must be a list"},
	}
	for _, tc := range bad {
		path := ""
		if tc.file != "" {
			path = filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-")+".yaml")
			if err := os.WriteFile(path, []byte(tc.file), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := Load(path, tc.env); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err %v, want one naming %s", tc.name, err, tc.want)
		}
	}
}
