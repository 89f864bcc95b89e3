package app

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/spillway-dev/spillway/internal/testkit/redistest"
)

// modelsUpstream is a real HTTP upstream answering GET /v1/models with
// body (status 200) or failing with 503, counting the list calls.
func modelsUpstream(tb testing.TB, body string, key string) (url string, calls *atomic.Int64) {
	tb.Helper()
	calls = new(atomic.Int64)
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/models" {
			http.NotFound(w, r)
			return
		}
		calls.Add(1)
		if body == "" || r.Header.Get("Authorization") != "Bearer "+key {
			http.Error(w, `{"error":{"message":"down"}}`, http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, body)
	}))
	tb.Cleanup(ts.Close)
	return ts.URL + "/v1", calls
}

// GET /v1/models through a running api in front of three upstreams, one
// of them down: the union of the two that answer and LLM_MODEL, their
// objects as they sent them, cached (a second list makes no upstream
// call); GET /v1/models/{id} finds one (a slash in its id too) through the
// official SDK, and answers an unknown one 404 model_not_found; both ask
// for the API key.
func TestModelsFromUpstreams(t *testing.T) {
	t.Parallel()
	const (
		objA = `{"id":"gpt-4o","object":"model","created":1715367049,"owned_by":"system","x_context":128000}`
		objB = `{"id":"meta-llama/Llama-3.1-8B","object":"model","created":3,"owned_by":"vllm","max_model_len":8192,"parent":null}`
	)
	a, aCalls := modelsUpstream(t, `{"object":"list","data":[`+objA+`]}`, "up-key")
	b, bCalls := modelsUpstream(t, `{"object":"list","data":[`+objB+`,`+objA+`]}`, "up-key")
	down, downCalls := modelsUpstream(t, "", "up-key")
	redis := redistest.Start(t)
	_, url, _ := startAPI(t, testConfig(t, map[string]string{
		"REDIS_URL": redis.URL(), "QUEUE_PREFIX": redistest.Prefix(t),
		"LLM_PROVIDER": "openai", "LLM_BASE_URL": a + "," + down + "," + b, "LLM_API_KEY": "up-key",
		"LLM_MODEL": "house-model", "API_KEYS": "client-key",
	}))

	get := func(path, key string) (int, string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, url+path, nil)
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}

	code, body := get("/v1/models", "client-key")
	var list struct {
		Object string            `json:"object"`
		Data   []json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal([]byte(body), &list); code != http.StatusOK || err != nil || list.Object != "list" || len(list.Data) != 3 {
		t.Fatalf("list: HTTP %d %s (%v)", code, body, err)
	}
	if string(list.Data[0]) != objA || string(list.Data[1]) != objB || !strings.Contains(string(list.Data[2]), `"id":"house-model"`) {
		t.Fatalf("list %s", body)
	}
	if code, _ := get("/v1/models", "client-key"); code != http.StatusOK || aCalls.Load() != 1 || bCalls.Load() != 1 || downCalls.Load() != 1 {
		t.Fatalf("second list: HTTP %d, upstream calls %d %d %d, want 1 each (cached)", code, aCalls.Load(), bCalls.Load(), downCalls.Load())
	}
	if code, body := get("/v1/models", ""); code != http.StatusUnauthorized || !strings.Contains(body, `"invalid_api_key"`) {
		t.Fatalf("without a key: HTTP %d %s", code, body)
	}
	if code, _ := get("/v1/models/gpt-4o", "wrong"); code != http.StatusUnauthorized {
		t.Fatalf("one model with a wrong key: HTTP %d", code)
	}

	client := sdkClient(url, option.WithAPIKey("client-key"))
	m, err := client.Models.Get(t.Context(), "meta-llama/Llama-3.1-8B")
	if err != nil || m.RawJSON() != objB || m.OwnedBy != "vllm" {
		t.Fatalf("SDK get: %+v, %v", m, err)
	}
	_, err = client.Models.Get(t.Context(), "gpt-9")
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound || apiErr.Code != "model_not_found" ||
		apiErr.Type != "invalid_request_error" || !strings.Contains(apiErr.Message, "gpt-9") {
		t.Fatalf("SDK get of an unknown model: %v", err)
	}
	if code, body := get("/v1/models/gpt-9", "client-key"); code != http.StatusNotFound ||
		body != `{"error":{"message":"The model 'gpt-9' does not exist or you do not have access to it.","type":"invalid_request_error","param":null,"code":"model_not_found"}}`+"\n" {
		t.Fatalf("unknown model: HTTP %d %s", code, body)
	}
}

// LLM_MODEL is the model sent when a request names none and is listed
// first; LLM_MODELS is the allow-list; MODELS_CACHE_SECONDS the cache; the
// simulator has no upstream to ask.
func TestModelsConfig(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t, map[string]string{
		"LLM_PROVIDER": "openai", "LLM_BASE_URL": "http://127.0.0.1:9/v1,http://127.0.0.2:9/v1",
		"LLM_MODEL": "house", "LLM_MODELS": "house,other", "MODELS_CACHE_SECONDS": "7",
	})
	if oc := OpenAIConfig(cfg); oc.Model != "house" {
		t.Fatalf("OpenAIConfig.Model %q", oc.Model)
	}
	mc := ModelsConfig(cfg)
	if len(mc.Upstreams) != 2 || strings.Join(mc.Always, ",") != "house" || strings.Join(mc.Allow, ",") != "house,other" || mc.TTL != 7*time.Second {
		t.Fatalf("models config %+v", mc)
	}
	if got := alwaysListed(testConfig(t, map[string]string{"LLM_PROVIDER": "sim", "LLM_MODEL": "sim"})); strings.Join(got, ",") != "sim" {
		t.Fatalf("LLM_MODEL that the configuration names already: %v", got)
	}
	sim := ModelsConfig(testConfig(t, map[string]string{"LLM_PROVIDER": "sim"}))
	if len(sim.Upstreams) != 0 || strings.Join(sim.Always, ",") != "sim" || sim.TTL != 60*time.Second {
		t.Fatalf("simulator models config %+v", sim)
	}
}
