package protocol

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestDecodeEmbeddings(t *testing.T) {
	t.Parallel()
	for body, text := range map[string]string{
		`{"model":"e","input":"hello","dimensions":3,"x":{"kept":true}}`: "hello",
		`{"model":"e","input":["a","b"]}`:                                "a\nb",
		`{"input":[1,2,3]}`:                                              "",
		`{"input":[[1,2],[3]]}`:                                          "",
	} {
		req, err := DecodeEmbeddings([]byte(body), DefaultLimits)
		if err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		if string(req.Body) != body || req.Route != RouteEmbeddings || len(req.Messages) != 1 ||
			req.Messages[0].Role != "user" || req.Messages[0].Content != text {
			t.Errorf("%s: read %+v", body, req)
		}
		up, ok := req.UpstreamBody("m")
		if req.Model != "" && (!ok || string(up) != body) {
			t.Errorf("%s: upstream body %s, want it as sent", body, up)
		}
		// Degradation's token cap leaves an embedding alone.
		req.CapTokens(16)
		if string(req.Body) != body || req.MaxTokens != 0 {
			t.Errorf("%s: capped to %s", body, req.Body)
		}
	}
	req, _ := DecodeEmbeddings([]byte(`{"input":"x"}`), DefaultLimits)
	if up, ok := req.UpstreamBody("m"); !ok || string(up) != `{"input":"x","model":"m"}` {
		t.Errorf("without a model: upstream body %s, want LLM_MODEL's", up)
	}
	for _, bad := range []string{`{}`, `{"input":null}`, `[1]`, `"x"`, "{\"input\":\"\x00\"}",
		`{"input":"x","model":3}`, "{\"input\":\"\xff\"}", `{"input":` + strings.Repeat("[", 70) + strings.Repeat("]", 70) + `}`} {
		if _, err := DecodeEmbeddings([]byte(bad), DefaultLimits); !errors.Is(err, ErrInvalidRequest) {
			t.Errorf("%q: error %v, want a 400", bad, err)
		}
	}
}

func TestDecodeCompletions(t *testing.T) {
	t.Parallel()
	body := `{"model":"gpt-3.5-turbo-instruct","prompt":"Say this is a test","max_tokens":7,"n":2,"echo":false,"suffix":null,"best_of":2}`
	req, err := DecodeCompletions([]byte(body), DefaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	if string(req.Body) != body || req.Route != RouteCompletions || req.MaxTokens != 7 || req.N != 2 ||
		req.Messages[0].Content != "Say this is a test" {
		t.Fatalf("read %+v", req)
	}
	if up, ok := req.UpstreamBody("m"); !ok || string(up) != body {
		t.Errorf("upstream body %s, want it as sent", up)
	}
	req.CapTokens(5)
	if req.MaxTokens != 5 || !strings.Contains(string(req.Body), `"max_tokens":5`) {
		t.Errorf("capped: %d %s", req.MaxTokens, req.Body)
	}
	// Streamed, it is relayed chunk by chunk, its body still as sent.
	streamed, err := DecodeCompletions([]byte(`{"prompt":"x","stream":true}`), DefaultLimits)
	if err != nil || !streamed.Stream || streamed.WholeAnswer() {
		t.Errorf("streamed completion: %+v, %v", streamed, err)
	}
	if up, ok := streamed.UpstreamBody(""); !ok || string(up) != `{"prompt":"x","stream":true}` {
		t.Errorf("streamed upstream body %s, want it as sent", up)
	}
	for _, bad := range []string{`{}`, `{"input":"x"}`, `{"prompt":null}`, `{"prompt":"x","max_tokens":0}`,
		`{"prompt":"x","max_tokens":1048577}`, `{"prompt":"x","n":9}`, `{"prompt":"x","stream":"yes"}`} {
		if _, err := DecodeCompletions([]byte(bad), DefaultLimits); !errors.Is(err, ErrInvalidRequest) {
			t.Errorf("%s: error %v, want a 400", bad, err)
		}
	}
}

// A queued whole-answer job carries its body byte for byte and is read
// again by its route.
func TestWholeJobRoundTrip(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		route, body string
		decode      func([]byte, Limits) (ChatRequest, error)
	}{
		{RouteEmbeddings, `{"input" : ["a", "b"], "model":"e"}`, DecodeEmbeddings},
		{RouteCompletions, `{"prompt":"p",  "max_tokens":3}`, DecodeCompletions},
	} {
		req, err := tc.decode([]byte(tc.body), DefaultLimits)
		if err != nil {
			t.Fatal(err)
		}
		now := time.Now()
		b, err := EncodeJob(Job{RequestID: "r1", UserID: "u", Payload: req, EnqueueTime: now, Deadline: now.Add(time.Minute)})
		if err != nil {
			t.Fatal(err)
		}
		j, err := DecodeJob(b)
		if err != nil {
			t.Fatalf("%s: %v", tc.route, err)
		}
		if j.Payload.Route != tc.route || string(j.Payload.Body) != tc.body || j.Payload.Messages[0].Content != req.Messages[0].Content {
			t.Errorf("%s: decoded %+v", tc.route, j.Payload)
		}
	}
}

// The decoders refuse with ErrInvalidRequest or accept, and keep the body
// of what they accept as sent, whatever the input.
func FuzzDecodeWhole(f *testing.F) {
	for _, s := range []string{`{"input":"x"}`, `{"input":[1,[2]],"model":"m"}`, `{"prompt":["a","b"],"max_tokens":3,"n":2}`,
		`{"prompt":"x","stream":true}`, `{}`, `[`, `{"input":"\ud800"}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, decode := range []func([]byte, Limits) (ChatRequest, error){DecodeEmbeddings, DecodeCompletions} {
			req, err := decode(b, DefaultLimits)
			if err != nil {
				if !errors.Is(err, ErrInvalidRequest) {
					t.Fatalf("%q: error %v is not ErrInvalidRequest", b, err)
				}
				continue
			}
			if string(req.Body) != string(b) || len(req.Messages) != 1 || req.N < 1 || req.MaxTokens < 0 {
				t.Fatalf("%q: read %+v", b, req)
			}
		}
	})
}
