package app

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

// POST /v1/embeddings and /v1/completions (docs/API.md): whole-answer
// calls, the body forwarded as sent and the upstream's JSON answer
// written as it came, on the direct and the queued path.

// wholeRecorder is an upstream of the whole-answer routes: it records
// each body and answers by the input's (or prompt's) text.
type wholeRecorder struct {
	mu     sync.Mutex
	bodies map[string][]byte // by path: the last body received
}

// wholeAnswers are the upstream's answers, by path; an indented one, as
// some upstreams write, is relayed compacted.
var wholeAnswers = map[string]string{
	"/v1/embeddings": `{
  "object": "list",
  "data": [
    {"object": "embedding", "index": 0, "embedding": [0.0023064255, -0.009327292, 0.015797347]},
    {"object": "embedding", "index": 1, "embedding": [-0.0028842222, 0.011015712, 1e-7]}
  ],
  "model": "text-embedding-3-small",
  "usage": {"prompt_tokens": 8, "total_tokens": 8}
}`,
	"/v1/completions": `{"id":"cmpl-up1","object":"text_completion","created":1700000000,"model":"gpt-3.5-turbo-instruct","system_fingerprint":"fp_up","choices":[{"text":"\n\nThis is indeed a test","index":0,"logprobs":null,"finish_reason":"length"}],"usage":{"prompt_tokens":5,"completion_tokens":7,"total_tokens":12}}`,
}

// wholeReject is the upstream's refusal of a bad request.
const wholeReject = `{"error":{"message":"'$.input' is invalid.","type":"invalid_request_error","param":null,"code":null}}`

func (rc *wholeRecorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	rc.mu.Lock()
	rc.bodies[r.URL.Path] = body
	rc.mu.Unlock()
	answer, ok := wholeAnswers[r.URL.Path]
	if !ok {
		http.Error(w, `{"error":{"message":"no such route"}}`, http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	if strings.Contains(string(body), "bad request") {
		w.WriteHeader(http.StatusBadRequest)
		_, _ = io.WriteString(w, wholeReject)
		return
	}
	_, _ = io.WriteString(w, answer)
}

func (rc *wholeRecorder) last(path string) []byte {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.bodies[path]
}

// wholeBodies are requests of each route with the parameters a client
// may send, which Spillway forwards without reading.
var wholeBodies = map[string]string{
	"/v1/embeddings":  `{"model":"text-embedding-3-small","input":["The food was delicious","and the waiter…"],"encoding_format":"float","dimensions":3,"user":"u-1","x_vendor":{"kept":true}}`,
	"/v1/completions": `{"model":"gpt-3.5-turbo-instruct","prompt":"Say this is a test","max_tokens":7,"temperature":0,"n":1,"logprobs":null,"echo":false,"stop":"\n","suffix":null,"best_of":1,"logit_bias":{"50256":-100},"seed":1,"user":"u-1"}`,
}

func jsonOf(tb testing.TB, b []byte) any {
	tb.Helper()
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		tb.Fatalf("%s: %v", b, err)
	}
	return v
}

// The same request sent straight to the upstream and through Spillway on
// both paths: the upstream receives the client's body byte for byte and
// the client gets the upstream's answer back.
func TestEmbeddingsCompletionsForwardedAsSent(t *testing.T) {
	t.Parallel()
	rec := &wholeRecorder{bodies: map[string][]byte{}}
	up := httptest.NewServer(rec)
	t.Cleanup(up.Close)
	for path, url := range proxyPaths(t, up.URL) {
		for route, body := range wholeBodies {
			name := path + " " + route
			straight := post(t, up.URL+route, body)
			want, _ := io.ReadAll(straight.Body)
			straight.Body.Close()

			resp := post(t, url+route, body)
			got, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Stream-Path") != path ||
				!strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
				t.Fatalf("%s: HTTP %d, path %q, type %q: %s", name, resp.StatusCode,
					resp.Header.Get("X-Stream-Path"), resp.Header.Get("Content-Type"), got)
			}
			if string(rec.last(route)) != body {
				t.Errorf("%s: upstream received\n %s\nwant\n %s", name, rec.last(route), body)
			}
			if !reflect.DeepEqual(jsonOf(t, got), jsonOf(t, want)) {
				t.Errorf("%s: got\n %s\nwant\n %s", name, got, want)
			}
		}
	}
}

// An upstream's 400 reaches the client with its status and body; a
// request Spillway refuses never reaches the upstream.
func TestEmbeddingsCompletionsErrors(t *testing.T) {
	t.Parallel()
	rec := &wholeRecorder{bodies: map[string][]byte{}}
	up := httptest.NewServer(rec)
	t.Cleanup(up.Close)
	for path, url := range proxyPaths(t, up.URL) {
		for route, body := range map[string]string{
			"/v1/embeddings":  `{"model":"m","input":"bad request"}`,
			"/v1/completions": `{"model":"m","prompt":"bad request"}`,
		} {
			resp := post(t, url+route, body)
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusBadRequest || strings.TrimSpace(string(b)) != wholeReject {
				t.Errorf("%s %s: HTTP %d %s\nwant 400 %s", path, route, resp.StatusCode, b, wholeReject)
			}
		}
		for route, body := range map[string]string{
			"/v1/embeddings":  `{"model":"m"}`,
			"/v1/completions": `{"model":"m","prompt":"x","max_tokens":0}`,
		} {
			before := rec.last(route)
			resp := post(t, url+route, body)
			var e struct {
				Error struct {
					Message string `json:"message"`
					Type    string `json:"type"`
				} `json:"error"`
			}
			err := json.NewDecoder(resp.Body).Decode(&e)
			resp.Body.Close()
			if resp.StatusCode != http.StatusBadRequest || err != nil || e.Error.Message == "" {
				t.Errorf("%s %s %s: HTTP %d %+v, want a 400 in OpenAI's shape", path, route, body, resp.StatusCode, e)
			}
			if string(rec.last(route)) != string(before) {
				t.Errorf("%s %s: the upstream received a refused request", path, route)
			}
		}
	}
}

// Embedded mode's simulator answers both routes: the same input gives
// the same embedding, another input another one; a completion carries
// the simulated text.
func TestEmbeddingsCompletionsSimulator(t *testing.T) {
	t.Parallel()
	_, url, _ := startAPI(t, testConfig(t, map[string]string{"SIM_FIRST_TOKEN_MS": "1", "SIM_TOKEN_INTERVAL_MS": "1"}))
	embed := func(input string) []float64 {
		resp := post(t, url+"/v1/embeddings", `{"model":"e","input":"`+input+`"}`)
		defer resp.Body.Close()
		var ans struct {
			Object string
			Data   []struct {
				Object    string
				Embedding []float64
			}
			Model string
			Usage struct {
				PromptTokens int `json:"prompt_tokens"`
			}
		}
		if err := json.NewDecoder(resp.Body).Decode(&ans); err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("embeddings: HTTP %d, %v", resp.StatusCode, err)
		}
		if ans.Object != "list" || len(ans.Data) != 1 || ans.Data[0].Object != "embedding" || len(ans.Data[0].Embedding) != 8 ||
			ans.Model != "e" || ans.Usage.PromptTokens < 1 {
			t.Fatalf("embeddings: %+v", ans)
		}
		return ans.Data[0].Embedding
	}
	a, b, c := embed("spillway"), embed("spillway"), embed("dam")
	if !reflect.DeepEqual(a, b) || reflect.DeepEqual(a, c) {
		t.Errorf("embeddings %v %v %v: want the same vector for the same input only", a, b, c)
	}

	resp := post(t, url+"/v1/completions", `{"model":"c","prompt":"Tell me about spillways","max_tokens":5}`)
	defer resp.Body.Close()
	var ans struct {
		Object  string
		Choices []struct {
			Text         string
			FinishReason string `json:"finish_reason"`
		}
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		}
	}
	if err := json.NewDecoder(resp.Body).Decode(&ans); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("completions: HTTP %d, %v", resp.StatusCode, err)
	}
	if ans.Object != "text_completion" || len(ans.Choices) != 1 || ans.Choices[0].Text == "" ||
		ans.Choices[0].FinishReason != "length" || ans.Usage.CompletionTokens != 5 {
		t.Errorf("completions: %+v", ans)
	}
}

// A whole-answer request that finds the pool full waits in the queue
// for the pool's slot and a worker makes its call: the upstream gets the
// body as sent and the client the upstream's answer, as on the direct
// path.
func TestEmbeddingsSpillToQueueWhenPoolFull(t *testing.T) {
	t.Parallel()
	rec := &wholeRecorder{bodies: map[string][]byte{}}
	held, release := make(chan struct{}), make(chan struct{})
	var once, releaseOnce sync.Once
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/completions" {
			once.Do(func() { close(held) })
			<-release // the direct call holds the pool's only slot
		}
		rec.ServeHTTP(w, r)
	}))
	t.Cleanup(up.Close)
	unhold := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(unhold)
	c := newCluster(t, fastSim(), map[string]string{"LLM_BASE_URL": up.URL + "/v1", "LLM_MODEL": "gpt-up",
		"CONNECTION_POOL_SIZE": "1", "CONNECTION_POOL_PER_USER": "1"})
	_, url := c.api(nil)
	c.consumer(nil)

	type answer struct {
		status int
		path   string
		body   []byte
		err    error
	}
	send := func(route string) chan answer {
		out := make(chan answer, 1)
		go func() {
			req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, url+route, strings.NewReader(wholeBodies[route]))
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				out <- answer{err: err}
				return
			}
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			out <- answer{resp.StatusCode, resp.Header.Get("X-Stream-Path"), b, err}
		}()
		return out
	}
	first := send("/v1/completions")
	select {
	case <-held:
	case <-t.Context().Done():
		t.Fatal("the first call never reached the upstream")
	}
	second := send("/v1/embeddings")
	testutil.Eventually(t, 10*time.Second, func() bool {
		return scrape(t, url+"/metrics", `spillway_active_streams{path="queued"}`) >= 1
	}, "the second request waiting in the queue")
	unhold()
	for route, ch := range map[string]chan answer{"/v1/completions": first, "/v1/embeddings": second} {
		a := <-ch
		want := map[string]string{"/v1/completions": "direct", "/v1/embeddings": "queued"}[route]
		if a.err != nil || a.status != http.StatusOK || a.path != want {
			t.Fatalf("%s: HTTP %d, path %q (want %s), %v: %s", route, a.status, a.path, want, a.err, a.body)
		}
		if string(rec.last(route)) != wholeBodies[route] ||
			!reflect.DeepEqual(jsonOf(t, a.body), jsonOf(t, []byte(wholeAnswers[route]))) {
			t.Errorf("%s: upstream got %s, client got %s", route, rec.last(route), a.body)
		}
	}
}
