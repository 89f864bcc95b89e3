package upstream

import (
	"reflect"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	t.Parallel()
	env := func(k string) (string, bool) {
		if k == "KEY_A" {
			return "sk-a", true
		}
		return "", false
	}
	d := Defaults{APIKey: "shared", MaxConcurrency: 8, LookupEnv: env}
	tests := []struct {
		name    string
		list    string
		yaml    []Spec
		d       Defaults
		want    []Spec
		wantErr []string // every fragment must appear
	}{
		{name: "neither", d: d},
		{
			name: "single url keeps working", list: "http://127.0.0.1:8081/v1", d: d,
			want: []Spec{{Name: "127.0.0.1:8081", BaseURL: "http://127.0.0.1:8081/v1", APIKey: "shared", Weight: 1, MaxConcurrency: 8}},
		},
		{
			name: "comma list named by host:port", list: " http://a:1/v1 , https://b/v1", d: d,
			want: []Spec{
				{Name: "a:1", BaseURL: "http://a:1/v1", APIKey: "shared", Weight: 1, MaxConcurrency: 8},
				{Name: "b:443", BaseURL: "https://b/v1", APIKey: "shared", Weight: 1, MaxConcurrency: 8},
			},
		},
		{
			name: "yaml defaults and key", d: d,
			yaml: []Spec{{Name: "gpu1", BaseURL: "http://g1/v1", APIKeyEnv: "KEY_A", MaxConcurrency: 4, Models: []string{"m"}},
				{Name: "spare", BaseURL: "https://api/v1", Weight: 3, RPM: 60, TPM: 1000}},
			want: []Spec{
				{Name: "gpu1", BaseURL: "http://g1/v1", APIKeyEnv: "KEY_A", APIKey: "sk-a", Weight: 1, MaxConcurrency: 4, Models: []string{"m"}},
				{Name: "spare", BaseURL: "https://api/v1", Weight: 3, RPM: 60, TPM: 1000},
			},
		},
		{
			name: "both forms", list: "http://a/v1", yaml: []Spec{{Name: "x", BaseURL: "http://x/v1"}}, d: d,
			wantErr: []string{"both set"},
		},
		{
			name: "comma list problems all at once", list: "http://a:1/v1,ftp://b/v1,,http:///v1,http://a:1/v1/", d: d,
			wantErr: []string{"entry 2 \"ftp://b/v1\" must start with http:// or https://", "entry 3 is empty",
				"entry 4 \"http:///v1\" has no host", `name "a:1" is used by entries 1 and 5`, "base URL \"http://a:1/v1/\" is used by entries 1 and 5"},
		},
		{
			name: "negative env cap", list: "http://a/v1", d: Defaults{MaxConcurrency: -1},
			wantErr: []string{"LLM_UPSTREAM_MAX_CONCURRENCY (-1) must not be negative"},
		},
		{
			name: "yaml problems all at once", d: d,
			yaml: []Spec{
				{Name: "a", BaseURL: "http://a/v1", Weight: -1, MaxConcurrency: -2, RPM: -3, TPM: -4},
				{Name: "a", BaseURL: "localhost:8080/v1", APIKeyEnv: "MISSING"},
				{BaseURL: "http://a/v1", Models: []string{""}},
				{Name: "b{x}", BaseURL: "http://c/v1"},
			},
			wantErr: []string{"upstreams[0] (a): weight (-1) must be at least 1", "max_concurrency (-2) must not be negative",
				"rpm (-3)", "tpm (-4)", "upstreams[1] (a): base_url \"localhost:8080/v1\" must start with http:// or https://",
				"api_key_env MISSING is not set", "upstreams[2]: name is required", "models has an empty entry",
				`name "a" is used by entries 1 and 2`, `base URL "http://a/v1" is used by entries 1 and 3`,
				`name "b{x}" must not contain braces`},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := Parse(tt.list, tt.yaml, tt.d)
			if len(tt.wantErr) > 0 {
				if err == nil {
					t.Fatalf("Parse = %+v, want an error", got)
				}
				for _, frag := range tt.wantErr {
					if !strings.Contains(err.Error(), frag) {
						t.Errorf("error %q\nlacks %q", err, frag)
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Parse =\n%+v\nwant\n%+v", got, tt.want)
			}
		})
	}
}

func TestSpecServes(t *testing.T) {
	t.Parallel()
	any := Spec{}
	some := Spec{Models: []string{"a", "b"}}
	if !any.Serves("x") || !some.Serves("b") || some.Serves("c") || !some.Serves("") {
		t.Fatal("Serves: wrong answer")
	}
}
