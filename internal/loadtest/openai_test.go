package loadtest

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"testing/iotest"
	"testing/synctest"
	"time"

	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/llm/simserver"
	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

// oaEvent returns one OpenAI chat.completion.chunk event with the given
// delta content (nil: a delta without content) and finish reason.
func oaEvent(tb testing.TB, content *string, finish string) string {
	tb.Helper()
	type delta struct {
		Role    string  `json:"role,omitempty"`
		Content *string `json:"content,omitempty"`
	}
	var fr *string
	if finish != "" {
		fr = &finish
	}
	b, err := json.Marshal(map[string]any{
		"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "sim-1",
		"choices": []any{map[string]any{"index": 0, "delta": delta{Content: content}, "finish_reason": fr}},
	})
	if err != nil {
		tb.Fatal(err)
	}
	return "data: " + string(b) + "\n\n"
}

// oaChunks returns content events for contents, then the finish event.
func oaChunks(tb testing.TB, contents ...string) string {
	tb.Helper()
	var b strings.Builder
	for _, c := range contents {
		b.WriteString(oaEvent(tb, &c, ""))
	}
	b.WriteString(oaEvent(tb, nil, "stop"))
	return b.String()
}

const oaDone = "data: [DONE]\n\n"

func TestCheckOpenAIStream(t *testing.T) {
	t.Parallel()
	good := oaChunks(t, testWant...)
	empty := ""
	roleOnly := "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n"
	usage := "data: {\"id\":\"x\",\"choices\":[],\"usage\":{\"prompt_tokens\":2,\"completion_tokens\":3,\"total_tokens\":5}}\n\n"
	errEv := "data: {\"error\":{\"message\":\"overloaded\",\"type\":\"server_error\",\"code\":null}}\n\n"

	tests := []struct {
		name     string
		stream   string
		lost     LostReason
		terminal string
		chunks   int
		content  string
		problem  string
	}{
		{name: "complete", stream: good + oaDone, terminal: "done", chunks: 3, content: "Hello wörld"},
		{name: "role-only first delta and usage chunk", stream: roleOnly + good + usage + oaDone, terminal: "done", chunks: 3, content: "Hello wörld"},
		{name: "empty content is not a chunk", stream: oaEvent(t, &empty, "") + good + oaDone, terminal: "done", chunks: 3, content: "Hello wörld"},
		{name: "CRLF and no space after data", stream: strings.ReplaceAll(strings.ReplaceAll(good+oaDone, "data: ", "data:"), "\n", "\r\n"),
			terminal: "done", chunks: 3, content: "Hello wörld"},
		{name: "comments ignored", stream: ": keep-alive\n\n" + good + oaDone, terminal: "done", chunks: 3, content: "Hello wörld"},
		{name: "missing [DONE]", stream: good, lost: ReasonNoTerminal, chunks: 3, content: "Hello wörld"},
		{name: "[DONE] cut before its blank line", stream: good + "data: [DONE]\n", lost: ReasonNoTerminal, chunks: 3},
		{name: "empty stream", stream: "", lost: ReasonNoTerminal},
		{name: "wrong content", stream: oaChunks(t, "Hel", "LO", " wörld") + oaDone, lost: ReasonContent, terminal: "done", chunks: 3, content: "HelLO wörld"},
		{name: "missing last chunk", stream: oaChunks(t, "Hel", "lo") + oaDone, lost: ReasonContent, terminal: "done", chunks: 2, content: "Hello"},
		{name: "chunk after [DONE]", stream: good + oaDone + oaChunks(t, "!"), lost: ReasonAfterTerminal, terminal: "done", chunks: 3},
		{name: "two [DONE]", stream: good + oaDone + oaDone, lost: ReasonAfterTerminal, terminal: "done", chunks: 3},
		{name: "blank lines after [DONE]", stream: good + oaDone + "\n\n", terminal: "done", chunks: 3, content: "Hello wörld"},
		{name: "error object ends the stream", stream: oaChunks(t, "Hel") + errEv, terminal: "error", chunks: 1, problem: "openai-error:server_error"},
		{name: "data not JSON", stream: "data: Hel\n\n" + oaDone, lost: ReasonMalformed},
		{name: "data a JSON array", stream: "data: [1]\n\n" + oaDone, lost: ReasonMalformed},
		{name: "neither choices nor usage", stream: "data: {\"id\":\"x\"}\n\n" + oaDone, lost: ReasonMalformed},
		{name: "named event", stream: "event: delta\n" + good + oaDone, lost: ReasonMalformed},
	}
	readers := map[string]func(io.Reader) io.Reader{
		"whole":    func(r io.Reader) io.Reader { return r },
		"one byte": iotest.OneByteReader,
	}
	for _, tt := range tests {
		for rname, wrap := range readers {
			t.Run(tt.name+"/"+rname, func(t *testing.T) {
				t.Parallel()
				rep := StreamCheck{Want: testWant, Format: FormatOpenAI}.Check(wrap(strings.NewReader(tt.stream)))
				if rep.Lost != (tt.lost != "") || rep.Reason != tt.lost {
					t.Fatalf("lost = %v (%s: %s), want reason %q", rep.Lost, rep.Reason, rep.Detail, tt.lost)
				}
				if rep.Lost && rep.Detail == "" {
					t.Error("lost stream without detail")
				}
				if rep.Terminal != tt.terminal {
					t.Errorf("terminal = %q, want %q", rep.Terminal, tt.terminal)
				}
				if rep.Chunks != tt.chunks {
					t.Errorf("chunks = %d, want %d", rep.Chunks, tt.chunks)
				}
				if tt.content != "" && rep.Content != tt.content {
					t.Errorf("content = %q, want %q", rep.Content, tt.content)
				}
				if tt.problem != "" && (rep.Problem == nil || rep.Problem.Type != tt.problem) {
					t.Errorf("problem = %+v, want type %q", rep.Problem, tt.problem)
				}
				if rep.Terminal == "done" && (rep.Done == nil || rep.Done.Path != PathUpstream || rep.Done.FinishReason != "stop") {
					t.Errorf("done = %+v, want path %q and finish reason stop", rep.Done, PathUpstream)
				}
				if rep.Chunks > 0 && rep.FirstChunk <= 0 {
					t.Error("first chunk time not recorded")
				}
			})
		}
	}
}

// TestCheckSpillwayIgnoresOpenAI makes sure the formats are not confused:
// an OpenAI stream is not a valid /v1/stream answer.
func TestCheckSpillwayIgnoresOpenAI(t *testing.T) {
	t.Parallel()
	rep := StreamCheck{Want: testWant}.Check(strings.NewReader(oaChunks(t, testWant...) + oaDone))
	if !rep.Lost {
		t.Fatalf("an OpenAI stream passed the /v1/stream check: %+v", rep)
	}
}

func TestOpenAIStopAfter(t *testing.T) {
	t.Parallel()
	rep := StreamCheck{Want: testWant, Format: FormatOpenAI, StopAfter: 2}.Check(strings.NewReader(oaChunks(t, testWant...) + oaDone))
	if !rep.Stopped || rep.Chunks != 2 || rep.Lost || rep.Terminal != "" {
		t.Errorf("report %+v, want stopped after 2 chunks", rep)
	}
}

// TestCheckPingIntervals writes a stream with known pauses on fake time
// and checks each ping's interval and the stream's longest silence.
func TestCheckPingIntervals(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		pr, pw := io.Pipe()
		ping := string(protocol.PingFrame)
		done := event(t, 4, protocol.EventDone, protocol.Done{FinishReason: "stop"})
		// Pauses before each write: headers→ping 2s, ping→ping 2s, a chunk
		// after 0.5s, a ping 2s after the chunk, then a 3s silence before
		// the rest: intervals 2, 2, 2 and max gap 3.
		script := []struct {
			wait time.Duration
			data string
		}{
			{2 * time.Second, ping},
			{2 * time.Second, ping},
			{500 * time.Millisecond, chunks(1, "Hel")},
			{2 * time.Second, ping},
			{3 * time.Second, chunks(2, "lo", " wörld") + done},
		}
		var wg sync.WaitGroup
		wg.Go(func() {
			for _, s := range script {
				testutil.AdvanceFakeClock(s.wait)
				_, _ = io.WriteString(pw, s.data)
			}
			_ = pw.Close()
		})
		rep := StreamCheck{Want: testWant}.Check(pr)
		wg.Wait()
		if rep.Lost || rep.Terminal != "done" {
			t.Fatalf("report %+v", rep)
		}
		want := []time.Duration{2 * time.Second, 2 * time.Second, 2 * time.Second}
		if len(rep.PingIntervals) != len(want) {
			t.Fatalf("ping intervals %v, want %v", rep.PingIntervals, want)
		}
		for i := range want {
			if rep.PingIntervals[i] != want[i] {
				t.Errorf("ping interval %d = %v, want %v", i, rep.PingIntervals[i], want[i])
			}
		}
		if rep.MaxGap != 3*time.Second {
			t.Errorf("max gap %v, want 3s", rep.MaxGap)
		}
	})
}

// TestRunOpenAIMode runs the load tool against the real simulated upstream
// (simserver) and against crafted upstreams that break the stream.
func TestRunOpenAIMode(t *testing.T) {
	t.Parallel()
	sim, err := llm.NewSim(llm.SimConfig{Tokens: testTokens, Seed: testSeed})
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu     sync.Mutex
		bodies []map[string]any
	)
	inner := simserver.New(sim, nil)
	good := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		var m map[string]any
		_ = json.Unmarshal(b, &m)
		mu.Lock()
		bodies = append(bodies, m)
		mu.Unlock()
		r.Body = io.NopCloser(strings.NewReader(string(b)))
		inner.ServeHTTP(w, r)
	}))
	t.Cleanup(good.Close)

	craft := func(stream func(t testing.TB, want []string) string) *httptest.Server {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			var req struct {
				Messages []protocol.Message `json:"messages"`
			}
			if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
				w.WriteHeader(http.StatusBadRequest)
				return
			}
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, stream(t, llm.SimChunks(req.Messages, testSeed, testTokens)))
		}))
		t.Cleanup(srv.Close)
		return srv
	}
	noDone := craft(func(t testing.TB, want []string) string { return oaChunks(t, want...) })
	wrong := craft(func(t testing.TB, want []string) string {
		return oaChunks(t, append([]string{"X"}, want[1:]...)...) + oaDone
	})

	tests := []struct {
		name       string
		url        string
		done, lost int
		reason     LostReason
	}{
		{"simserver", good.URL, 8, 0, ""},
		{"missing [DONE]", noDone.URL, 0, 8, ReasonNoTerminal},
		{"wrong content", wrong.URL, 0, 8, ReasonContent},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := testConfig(tt.url + "/v1/chat/completions")
			cfg.Mode = ModeOpenAI
			cfg.DistinctPrompts = 3
			res, err := Run(t.Context(), cfg, nil)
			if err != nil {
				t.Fatal(err)
			}
			checkTally(t, res)
			if res.Done != tt.done || res.Lost != tt.lost || res.LostByReason[tt.reason] != tt.lost {
				t.Fatalf("done %d lost %d %v, want %d, %d %s; samples %v",
					res.Done, res.Lost, res.LostByReason, tt.done, tt.lost, tt.reason, res.LostSamples)
			}
			if res.Paths[PathUpstream] != 8 {
				t.Errorf("paths %v, want 8 under %q", res.Paths, PathUpstream)
			}
			if tt.done > 0 {
				l, ok := res.Latency[PathUpstream]
				if !ok || l.Count != tt.done || l.FirstChunk.Max <= 0 {
					t.Errorf("latency %+v, want %d upstream samples", res.Latency, tt.done)
				}
			}
		})
	}
	t.Run("request shape", func(t *testing.T) {
		t.Parallel()
		cfg := testConfig(good.URL + "/v1/chat/completions")
		cfg.Mode, cfg.Requests, cfg.Concurrency, cfg.MaxTokens, cfg.Model = ModeOpenAI, 1, 1, 4, "m-2"
		res, err := Run(t.Context(), cfg, nil)
		if err != nil || res.Done != 1 {
			t.Fatalf("run: %v %+v", err, res)
		}
		mu.Lock()
		defer mu.Unlock()
		var b map[string]any
		for _, m := range bodies {
			if m["model"] == "m-2" {
				b = m
			}
		}
		if b == nil || b["stream"] != true || b["max_tokens"] != float64(4) {
			t.Fatalf("request bodies %v, want one with model m-2, stream true, max_tokens 4", bodies)
		}
		msgs, _ := b["messages"].([]any)
		if len(msgs) != 1 {
			t.Errorf("messages %v", b["messages"])
		}
	})
}

// TestRunPingIntervals checks that ping timings reach the Result.
func TestRunPingIntervals(t *testing.T) {
	t.Parallel()
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request, n int, want []string) {
		send := sse(w, "queued")
		send("") // headers now, as the api sends them when the queue took the job
		for range 2 {
			select { // the server's pacing is what the test measures
			case <-time.After(20 * time.Millisecond):
			case <-r.Context().Done():
				return
			}
			send(string(protocol.PingFrame))
		}
		send(chunks(1, want...) + doneFrame(len(want)+1, "queued"))
	})
	res, err := Run(t.Context(), testConfig(srv.URL), nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Done != 8 || res.Pings != 16 {
		t.Fatalf("done %d pings %d, want 8 and 16", res.Done, res.Pings)
	}
	if res.PingInterval.P50 < 15 || res.PingInterval.Max < res.PingInterval.P50 || res.MaxGap.P50 < 15 {
		t.Errorf("ping interval %+v, max gap %+v: want about 20ms", res.PingInterval, res.MaxGap)
	}
}

// TestRunRampUp checks that the clients' first requests are spread over
// the ramp-up time.
func TestRunRampUp(t *testing.T) {
	t.Parallel()
	var (
		mu    sync.Mutex
		times []time.Time
	)
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request, n int, want []string) {
		mu.Lock()
		times = append(times, time.Now())
		mu.Unlock()
		send := sse(w, "direct")
		// Long enough that no client finishes before the last one starts,
		// so each request is some client's first.
		select {
		case <-time.After(500 * time.Millisecond):
		case <-r.Context().Done():
			return
		}
		send(chunks(1, want...) + doneFrame(len(want)+1, "direct"))
	})
	cfg := testConfig(srv.URL)
	cfg.Concurrency, cfg.Requests, cfg.RampUp = 4, 4, 300*time.Millisecond
	start := time.Now()
	res, err := Run(t.Context(), cfg, nil)
	if err != nil || res.Done != 4 {
		t.Fatalf("run: %v %+v", err, res)
	}
	mu.Lock()
	defer mu.Unlock()
	last := times[0]
	for _, tm := range times {
		if tm.After(last) {
			last = tm
		}
	}
	// The fourth client starts 3/4 of the ramp after the first.
	if d := last.Sub(start); d < 200*time.Millisecond {
		t.Errorf("last request %v after start, want at least 225ms", d)
	}
}
