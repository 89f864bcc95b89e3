package llm

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
	"unicode/utf8"

	"github.com/spillway-dev/spillway/internal/bounds"
	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

func userMsg(s string) []protocol.Message {
	return []protocol.Message{{Role: "user", Content: s}}
}

func TestSimChunksDeterministic(t *testing.T) {
	t.Parallel()
	base := []protocol.Message{{Role: "system", Content: "be brief"}, {Role: "user", Content: "hello there"}}
	want := SimChunks(base, 1, 48)
	if got := SimChunks(slices.Clone(base), 1, 48); !slices.Equal(got, want) {
		t.Fatalf("same input, different output:\n%q\n%q", got, want)
	}
	if len(want) != 48 {
		t.Fatalf("got %d chunks, want 48", len(want))
	}
	differ := []struct {
		name string
		msgs []protocol.Message
		seed int64
	}{
		{"seed", base, 2},
		{"content", []protocol.Message{{Role: "system", Content: "be brief"}, {Role: "user", Content: "hello there!"}}, 1},
		{"role", []protocol.Message{{Role: "user", Content: "be brief"}, {Role: "user", Content: "hello there"}}, 1},
		{"order", []protocol.Message{base[1], base[0]}, 1},
		{"boundary", []protocol.Message{{Role: "system", Content: "be brie"}, {Role: "user", Content: "fhello there"}}, 1},
		{"split", []protocol.Message{{Role: "system", Content: "be brief"}, {Role: "user", Content: "hello"}, {Role: "user", Content: " there"}}, 1},
		{"extra message", append(slices.Clone(base), protocol.Message{Role: "assistant", Content: "hi"}), 1},
	}
	for _, tc := range differ {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := SimChunks(tc.msgs, tc.seed, 48); slices.Equal(got, want) {
				t.Errorf("changed %s gave the same answer %q", tc.name, strings.Join(got, ""))
			}
		})
	}
}

func TestSimChunksCount(t *testing.T) {
	t.Parallel()
	for _, n := range []int{-1, 0} {
		if got := SimChunks(userMsg("hi"), 1, n); got != nil {
			t.Errorf("SimChunks(tokens=%d) = %q, want nil", n, got)
		}
	}
	for _, n := range []int{1, 2, 3, 7, 48, 500} {
		if got := SimChunks(userMsg("hi"), 1, n); len(got) != n {
			t.Errorf("SimChunks(tokens=%d) gave %d chunks", n, len(got))
		}
	}
}

// TestSimChunksWellFormed checks every chunk of many random prompts: no CR,
// LF or NUL (they would inject SSE fields downstream), valid UTF-8, not
// empty, the first without a leading space, the answer ending a sentence.
func TestSimChunksWellFormed(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(7, 7))
	multiByte := 0
	for i := range 2000 {
		msgs := make([]protocol.Message, 1+r.IntN(4))
		for j := range msgs {
			b := make([]byte, r.IntN(64))
			for k := range b {
				b[k] = byte(r.IntN(256)) // arbitrary bytes, CR/LF/NUL included
			}
			msgs[j] = protocol.Message{Role: []string{"system", "user", "assistant", "tool"}[r.IntN(4)], Content: string(b)}
		}
		seed, tokens := r.Int64(), 1+r.IntN(200)
		chunks := SimChunks(msgs, seed, tokens)
		if len(chunks) != tokens {
			t.Fatalf("prompt %d: %d chunks, want %d", i, len(chunks), tokens)
		}
		if strings.HasPrefix(chunks[0], " ") {
			t.Fatalf("prompt %d: first chunk %q has a leading space", i, chunks[0])
		}
		for k, c := range chunks {
			if c == "" || strings.ContainsAny(c, "\r\n\x00") || !utf8.ValidString(c) {
				t.Fatalf("prompt %d chunk %d: bad chunk %q", i, k, c)
			}
			if !isASCII(c) {
				multiByte++
			}
		}
		if text := strings.Join(chunks, ""); !strings.ContainsAny(text[len(text)-1:], ".!?") {
			t.Fatalf("prompt %d: answer %q does not end a sentence", i, text)
		}
	}
	if multiByte == 0 {
		t.Error("no chunk held a multi-byte UTF-8 word")
	}
}

func newTestSim(tb testing.TB, cfg SimConfig) *Sim {
	tb.Helper()
	s, err := NewSim(cfg)
	if err != nil {
		tb.Fatalf("NewSim: %v", err)
	}
	return s
}

// fastSim is a simulator without delays.
func fastSim(tokens int) SimConfig {
	return SimConfig{Tokens: tokens, Seed: 1}
}

func collect(tb testing.TB, p Provider, ctx context.Context, req protocol.ChatRequest) ([]string, Result, error) {
	tb.Helper()
	var got []string
	res, err := p.Stream(ctx, req, func(chunk protocol.Chunk) error {
		c := chunk.Content
		got = append(got, c)
		return nil
	})
	return got, res, err
}

func TestSimStream(t *testing.T) {
	t.Parallel()
	msgs := []protocol.Message{{Role: "system", Content: "you are terse"}, {Role: "user", Content: "tell me  a story\nplease"}}
	const promptWords = 3 + 5
	temp := 1.5
	tests := []struct {
		name      string
		req       protocol.ChatRequest
		chunks    int
		finish    string
		promptTok int
	}{
		{"full", protocol.ChatRequest{Messages: msgs}, 48, "stop", promptWords},
		{"max_tokens truncates", protocol.ChatRequest{Messages: msgs, MaxTokens: 5}, 5, "length", promptWords},
		{"max_tokens one", protocol.ChatRequest{Messages: msgs, MaxTokens: 1}, 1, "length", promptWords},
		{"max_tokens equal", protocol.ChatRequest{Messages: msgs, MaxTokens: 48}, 48, "stop", promptWords},
		{"max_tokens larger", protocol.ChatRequest{Messages: msgs, MaxTokens: 1000}, 48, "stop", promptWords},
		{"model and temperature ignored", protocol.ChatRequest{Messages: msgs, Model: "gpt-9", Temperature: &temp}, 48, "stop", promptWords},
		{"blank prompt counts one", protocol.ChatRequest{Messages: userMsg("   ")}, 48, "stop", 1},
	}
	s := newTestSim(t, fastSim(48))
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, res, err := collect(t, s, t.Context(), tc.req)
			if err != nil {
				t.Fatalf("Stream: %v", err)
			}
			want := SimChunks(tc.req.Messages, 1, 48)[:tc.chunks]
			if !slices.Equal(got, want) {
				t.Errorf("chunks\n got %q\nwant %q", got, want)
			}
			wantRes := Result{FinishReason: tc.finish, Usage: protocol.Usage{
				PromptTokens: tc.promptTok, CompletionTokens: tc.chunks, TotalTokens: tc.promptTok + tc.chunks}}
			if res != wantRes {
				t.Errorf("result %+v, want %+v", res, wantRes)
			}
		})
	}
}

// TestSimPacing checks the waits on a fake clock: FirstToken before the
// first chunk, TokenInterval between chunks, nothing after the last.
func TestSimPacing(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		s := newTestSim(t, SimConfig{FirstToken: 150 * time.Millisecond, TokenInterval: 20 * time.Millisecond, Tokens: 5, Seed: 1})
		start := time.Now()
		var at []time.Duration
		_, err := s.Stream(t.Context(), protocol.ChatRequest{Messages: userMsg("hi")}, func(protocol.Chunk) error {
			at = append(at, time.Since(start))
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		want := []time.Duration{150, 170, 190, 210, 230}
		for i := range want {
			want[i] *= time.Millisecond
		}
		if !slices.Equal(at, want) {
			t.Errorf("chunks at %v, want %v", at, want)
		}
		if d := time.Since(start); d != 230*time.Millisecond {
			t.Errorf("Stream took %v, want 230ms", d)
		}
	})
}

// TestSimCancel cancels on the real clock and requires Stream to return
// within 100ms with the context's error: while it waits an hour for the
// first or the next chunk, or while it streams without any wait.
func TestSimCancel(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name        string
		cfg         SimConfig
		cancelAfter int // chunks emitted before cancelling
	}{
		{"waiting for first chunk", SimConfig{FirstToken: time.Hour, Tokens: 10, Seed: 1}, 0},
		{"waiting for second chunk", SimConfig{TokenInterval: time.Hour, Tokens: 10, Seed: 1}, 1},
		{"streaming without waits", SimConfig{Tokens: 10, Seed: 1}, 3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newTestSim(t, tc.cfg)
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			type outcome struct {
				n   int
				err error
			}
			cancelled := make(chan time.Time, 1)
			done := make(chan outcome, 1)
			go func() {
				n := 0
				_, err := s.Stream(ctx, protocol.ChatRequest{Messages: userMsg("hi")}, func(protocol.Chunk) error {
					n++
					if n == tc.cancelAfter {
						// Cancel from inside emit: without waits the
						// simulator would otherwise finish first.
						cancel()
						cancelled <- time.Now()
					}
					return nil
				})
				done <- outcome{n, err}
			}()
			if tc.cancelAfter == 0 {
				cancel()
				cancelled <- time.Now()
			}
			at := <-cancelled
			select {
			case o := <-done:
				if d := time.Since(at); d > 100*time.Millisecond {
					t.Errorf("Stream returned %v after cancel", d)
				}
				if !errors.Is(o.err, context.Canceled) {
					t.Errorf("err = %v, want it to wrap context.Canceled", o.err)
				}
				if IsRetryable(o.err) {
					t.Errorf("cancellation %v reported retryable", o.err)
				}
				if o.n != tc.cancelAfter {
					t.Errorf("emitted %d chunks, want %d", o.n, tc.cancelAfter)
				}
			case <-time.After(100 * time.Millisecond):
				t.Fatal("Stream did not return within 100ms of cancel")
			}
		})
	}
}

// TestSimCancelWhileWaiting cancels on a fake clock once Stream is
// durably blocked in its wait, so it proves that the wait itself ends on
// cancel rather than on its timer.
func TestSimCancelWhileWaiting(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		cfg    SimConfig
		chunks int
	}{
		{"first chunk", SimConfig{FirstToken: time.Hour, Tokens: 10, Seed: 1}, 0},
		{"next chunk", SimConfig{TokenInterval: time.Hour, Tokens: 10, Seed: 1}, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				s := newTestSim(t, tc.cfg)
				ctx, cancel := context.WithCancel(t.Context())
				start := time.Now()
				var got []string
				var err error
				done := make(chan struct{})
				go func() {
					got, _, err = collect(t, s, ctx, protocol.ChatRequest{Messages: userMsg("hi")})
					close(done)
				}()
				synctest.Wait()
				cancel()
				<-done
				if d := time.Since(start); d != 0 {
					t.Errorf("Stream returned after %v of fake time, want at once", d)
				}
				if !errors.Is(err, context.Canceled) || len(got) != tc.chunks {
					t.Errorf("got %d chunks and %v, want %d and context.Canceled", len(got), err, tc.chunks)
				}
			})
		})
	}
}

// TestSimDeadline checks on a fake clock that a deadline ends the wait for
// the next chunk at once.
func TestSimDeadline(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		s := newTestSim(t, SimConfig{TokenInterval: time.Hour, Tokens: 10, Seed: 1})
		ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
		defer cancel()
		start := time.Now()
		got, _, err := collect(t, s, ctx, protocol.ChatRequest{Messages: userMsg("hi")})
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("err = %v, want it to wrap context.DeadlineExceeded", err)
		}
		if d := time.Since(start); d != 50*time.Millisecond {
			t.Errorf("returned after %v, want 50ms", d)
		}
		if len(got) != 1 {
			t.Errorf("emitted %d chunks, want 1", len(got))
		}
	})
}

func TestSimCancelledBeforeCall(t *testing.T) {
	t.Parallel()
	s := newTestSim(t, fastSim(5))
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	got, _, err := collect(t, s, ctx, protocol.ChatRequest{Messages: userMsg("hi")})
	if !errors.Is(err, context.Canceled) || len(got) != 0 {
		t.Errorf("got %d chunks and %v, want none and context.Canceled", len(got), err)
	}
}

func TestSimEmitError(t *testing.T) {
	t.Parallel()
	s := newTestSim(t, fastSim(10))
	boom := errors.New("client gone")
	n := 0
	_, err := s.Stream(t.Context(), protocol.ChatRequest{Messages: userMsg("hi")}, func(protocol.Chunk) error {
		n++
		if n == 3 {
			return boom
		}
		return nil
	})
	if !errors.Is(err, boom) {
		t.Errorf("err = %v, want it to wrap the emit error", err)
	}
	if n != 3 {
		t.Errorf("emit called %d times, want 3", n)
	}
}

func wantSimFault(tb testing.TB, err error, status int) {
	tb.Helper()
	var e *Error
	if !errors.As(err, &e) {
		tb.Fatalf("err = %v, want *Error", err)
	}
	if !e.Retryable || e.Status != status || !errors.Is(err, ErrSimulatedFault) || !IsRetryable(err) {
		tb.Errorf("err = %#v, want retryable simulated fault with status %d", e, status)
	}
}

func TestSimFaults(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		cfg     SimConfig
		req     protocol.ChatRequest
		chunks  int // emitted before the failure
		status  int
		request int
	}{
		{"fail rate", SimConfig{Tokens: 10, FailRate: 1}, protocol.ChatRequest{Messages: userMsg("hi")}, 0, 503, 0},
		{"midstream", SimConfig{Tokens: 10, FailMidstreamRate: 1}, protocol.ChatRequest{Messages: userMsg("hi")}, 5, 502, 0},
		{"midstream odd", SimConfig{Tokens: 7, FailMidstreamRate: 1}, protocol.ChatRequest{Messages: userMsg("hi")}, 3, 502, 0},
		{"midstream truncated", SimConfig{Tokens: 48, FailMidstreamRate: 1}, protocol.ChatRequest{Messages: userMsg("hi"), MaxTokens: 4}, 2, 502, 0},
		{"midstream one chunk", SimConfig{Tokens: 1, FailMidstreamRate: 1}, protocol.ChatRequest{Messages: userMsg("hi")}, 1, 502, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newTestSim(t, tc.cfg)
			for range 20 { // the dice must come up the same way every time
				got, _, err := collect(t, s, t.Context(), tc.req)
				wantSimFault(t, err, tc.status)
				if want := SimChunks(tc.req.Messages, 0, tc.cfg.Tokens)[:tc.chunks]; !slices.Equal(got, want) {
					t.Fatalf("emitted %q, want %q", got, want)
				}
			}
		})
	}
}

// TestSimFailRateIsRandom checks that faults do not follow the text's seed:
// the same request fails on some calls and succeeds on others.
func TestSimFailRateIsRandom(t *testing.T) {
	t.Parallel()
	s := newTestSim(t, SimConfig{Tokens: 3, FailRate: 0.5})
	var mu sync.Mutex
	fails, oks := 0, 0
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 50 {
				_, _, err := collect(t, s, t.Context(), protocol.ChatRequest{Messages: userMsg("same")})
				mu.Lock()
				if err != nil {
					fails++
				} else {
					oks++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	// 400 fair coin flips: either count below 100 has odds under 1e-24.
	if fails < 100 || oks < 100 {
		t.Errorf("%d failures and %d successes of 400 calls at FailRate 0.5", fails, oks)
	}
}

func TestSimFailFirst(t *testing.T) {
	t.Parallel()
	s := newTestSim(t, SimConfig{Tokens: 4, Seed: 3, FailFirst: 2})
	req := protocol.ChatRequest{Messages: userMsg("retry me")}
	for i := range 2 {
		got, _, err := collect(t, s, t.Context(), req)
		if len(got) != 0 {
			t.Fatalf("call %d emitted %q before failing", i+1, got)
		}
		wantSimFault(t, err, 503)
	}
	for i := range 3 {
		got, res, err := collect(t, s, t.Context(), req)
		if err != nil {
			t.Fatalf("call %d: %v", i+3, err)
		}
		if want := SimChunks(req.Messages, 3, 4); !slices.Equal(got, want) || res.FinishReason != "stop" {
			t.Fatalf("call %d: %q %q, want %q stop", i+3, got, res.FinishReason, want)
		}
	}
}

func TestSimConfigValidate(t *testing.T) {
	t.Parallel()
	ok := DefaultSimConfig()
	tests := []struct {
		name  string
		edit  func(*SimConfig)
		valid bool
	}{
		{"defaults", func(*SimConfig) {}, true},
		{"no delays", func(c *SimConfig) { c.FirstToken, c.TokenInterval = 0, 0 }, true},
		{"rates one", func(c *SimConfig) { c.FailRate, c.FailMidstreamRate = 1, 1 }, true},
		{"zero value", func(c *SimConfig) { *c = SimConfig{} }, false},
		{"negative first token", func(c *SimConfig) { c.FirstToken = -1 }, false},
		{"negative interval", func(c *SimConfig) { c.TokenInterval = -1 }, false},
		{"zero tokens", func(c *SimConfig) { c.Tokens = 0 }, false},
		{"huge tokens", func(c *SimConfig) { c.Tokens = 1<<20 + 1 }, false},
		{"fail rate above one", func(c *SimConfig) { c.FailRate = 1.01 }, false},
		{"fail rate negative", func(c *SimConfig) { c.FailRate = -0.1 }, false},
		{"fail rate NaN", func(c *SimConfig) { c.FailRate = math.NaN() }, false},
		{"midstream NaN", func(c *SimConfig) { c.FailMidstreamRate = math.NaN() }, false},
		{"negative fail first", func(c *SimConfig) { c.FailFirst = -1 }, false},
		{"fail status 429", func(c *SimConfig) { c.FailStatus = 429 }, true},
		{"fail status 599", func(c *SimConfig) { c.FailStatus = 599 }, true},
		{"fail status 404", func(c *SimConfig) { c.FailStatus = 404 }, false},
		{"fail status 600", func(c *SimConfig) { c.FailStatus = 600 }, false},
		{"negative retry after", func(c *SimConfig) { c.FailRetryAfter = -time.Second }, false},
		{"negative stall", func(c *SimConfig) { c.StallAfter = -1 }, false},
		{"negative concurrency", func(c *SimConfig) { c.MaxConcurrency = -1 }, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg := ok
			tc.edit(&cfg)
			s, err := NewSim(cfg)
			if (err == nil) != tc.valid {
				t.Fatalf("NewSim(%+v) err = %v, want valid=%v", cfg, err, tc.valid)
			}
			if (s != nil) != tc.valid {
				t.Errorf("NewSim returned %v with err %v", s, err)
			}
		})
	}
	if s := newTestSim(t, ok); s.Name() != "sim" {
		t.Errorf("Name() = %q", s.Name())
	}
}

// TestSimThrottledFirst: the first K calls are refused with the status
// and Retry-After configured, then the answer is the usual one.
func TestSimThrottledFirst(t *testing.T) {
	t.Parallel()
	s := newTestSim(t, SimConfig{Tokens: 4, Seed: 3, FailFirst: 2, FailStatus: 429, FailRetryAfter: 2 * time.Second})
	req := protocol.ChatRequest{Messages: userMsg("retry me")}
	for range 2 {
		_, _, err := collect(t, s, t.Context(), req)
		wantSimFault(t, err, 429)
		if d, ok := (RetryPolicy{}).Delay(err, 1); !ok || d != 2*time.Second {
			t.Errorf("Delay = %v, %v; want 2s from Retry-After", d, ok)
		}
	}
	if got, _, err := collect(t, s, t.Context(), req); err != nil || !slices.Equal(got, SimChunks(req.Messages, 3, 4)) {
		t.Errorf("third call: %q, %v", got, err)
	}
}

// TestSimStall: a call falls silent after StallAfter chunks until its
// context ends; a shorter answer completes.
func TestSimStall(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		s := newTestSim(t, SimConfig{FirstToken: time.Second, TokenInterval: time.Second, Tokens: 10, Seed: 1, StallAfter: 3})
		ctx, cancel := context.WithTimeout(t.Context(), time.Hour)
		defer cancel()
		start := time.Now()
		got, _, err := collect(t, s, ctx, protocol.ChatRequest{Messages: userMsg("hi")})
		if len(got) != 3 || !errors.Is(err, context.DeadlineExceeded) || time.Since(start) != time.Hour {
			t.Errorf("got %d chunks, %v after %v; want 3 and the context's end after 1h", len(got), err, time.Since(start))
		}
		got, _, err = collect(t, s, t.Context(), protocol.ChatRequest{Messages: userMsg("hi"), MaxTokens: 3})
		if len(got) != 3 || err != nil {
			t.Errorf("3-chunk answer: %d chunks, %v; want it whole", len(got), err)
		}
	})
}

// TestSimMaxConcurrency: with C calls in flight the next is refused at
// once with 429 and Retry-After; once one returns, a call is admitted.
func TestSimMaxConcurrency(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		s := newTestSim(t, SimConfig{FirstToken: time.Minute, Tokens: 2, Seed: 1, MaxConcurrency: 2, FailRetryAfter: time.Second})
		req := protocol.ChatRequest{Messages: userMsg("hi")}
		var wg sync.WaitGroup
		for range 2 {
			wg.Go(func() {
				if _, _, err := collect(t, s, t.Context(), req); err != nil {
					t.Errorf("admitted call: %v", err)
				}
			})
		}
		synctest.Wait() // both wait for their first token
		start := time.Now()
		_, _, err := collect(t, s, t.Context(), req)
		wantSimFault(t, err, 429)
		var e *Error
		if errors.As(err, &e); e.RetryAfter != time.Second || time.Since(start) != 0 {
			t.Errorf("refusal %v after %v, want Retry-After 1s at once", err, time.Since(start))
		}
		wg.Wait()
		if _, _, err := collect(t, s, t.Context(), req); err != nil {
			t.Errorf("call after the others returned: %v", err)
		}
	})
}

// The settings' ranges are *bounds.Errors naming the field, every one
// reported together.
func TestSimConfigBounds(t *testing.T) {
	t.Parallel()
	c := SimConfig{FirstToken: -1, TokenInterval: -1, Tokens: 0, FailRate: 2, FailMidstreamRate: math.NaN()}
	err := c.Validate()
	got := bounds.Errors(err)
	want := []string{"FirstToken", "TokenInterval", "Tokens", "FailRate", "FailMidstreamRate"}
	if len(got) != len(want) {
		t.Fatalf("Validate() = %v, want bounds errors for %v", err, want)
	}
	for i, e := range got {
		if e.Field != want[i] {
			t.Errorf("error %d names %s, want %s", i, e.Field, want[i])
		}
	}
	if err := (SimConfig{Tokens: maxSimTokens + 1}).Validate(); !testutil.HasBound(err, "Tokens") {
		t.Errorf("Tokens above the maximum: %v", err)
	}
}

// The timeouts out of range are *bounds.Errors naming the field, reported
// before any other check; NewOpenAI fills a zero one with its default.
func TestOpenAIConfigBounds(t *testing.T) {
	t.Parallel()
	err := OpenAIConfig{FirstTokenTimeout: 0, IdleTimeout: -time.Second}.Validate()
	if !testutil.HasBound(err, "FirstTokenTimeout") || !testutil.HasBound(err, "IdleTimeout") {
		t.Errorf("Validate() = %v, want bounds errors for both timeouts", err)
	}
	if _, err := NewOpenAI(OpenAIConfig{BaseURL: "http://127.0.0.1:1/v1"}); err != nil {
		t.Errorf("NewOpenAI with zero timeouts: %v", err)
	}
}
