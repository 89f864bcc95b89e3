package stream_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/openaiwire"
	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/stream"
	"github.com/spillway-dev/spillway/internal/streamlog"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

// endLog is a stream log that keeps every event and closes ended when a
// terminal one arrives.
type endLog struct {
	mu     sync.Mutex
	events []streamlog.Event
	ended  chan struct{}
}

func (*endLog) Open(string, string) bool { return true }
func (l *endLog) Append(_ string, ev streamlog.Event) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, ev)
	if ev.Name == protocol.EventDone || ev.Name == protocol.EventError {
		close(l.ended)
	}
	return true
}

// unwatched is a provider that never says when it reads (it hides the
// caller's llm.ReadWatcher): the direct path then sends each chunk at once.
type unwatched struct{ llm.Provider }

type nopWatcher struct{}

func (nopWatcher) Reading(bool) {}
func (nopWatcher) BeforeRead()  {}

func (u unwatched) Stream(ctx context.Context, req protocol.ChatRequest, emit func(protocol.Chunk) error) (llm.Result, error) {
	return u.Provider.Stream(llm.WithReadWatcher(ctx, nopWatcher{}), req, emit)
}

// The direct path's producer writes its chunks itself, on the provider's
// goroutine (session.chunkInline): a client that leaves mid-answer
// detaches the stream, and the producer goes on logging the answer, every
// chunk once, in order, then done, for a resume; what the client got is
// the log's beginning. The upstream holds the answer after its tenth
// chunk until the client has gone, so the detach comes mid-answer; with a
// provider that says when it reads (chunks gathered until the next read)
// and one that does not (each sent at once).
func TestDirectDetachMidAnswerLogsEveryChunk(t *testing.T) {
	t.Parallel()
	const chunks, held, read = 30, 10, 5
	enc := openaiwire.NewChunkEncoder("up-1", "sim-1", 1700000000)
	var want strings.Builder
	events := make([][]byte, 0, chunks+1)
	for i := range chunks {
		c := fmt.Sprintf("c%02d ", i)
		want.WriteString(c)
		events = append(events, enc.AppendContent(nil, c, i == 0))
	}
	events = append(events, append(enc.AppendFinish(nil, "stop"), openaiwire.DoneFrame...))
	for _, tc := range []struct {
		name  string
		wrap  func(llm.Provider) llm.Provider
		paced time.Duration
	}{
		{"watched", func(p llm.Provider) llm.Provider { return p }, time.Millisecond},
		{"unwatched", func(p llm.Provider) llm.Provider { return unwatched{p} }, time.Millisecond},
		{"watched-unpaced", func(p llm.Provider) llm.Provider { return p }, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			clientGone := make(chan struct{})
			up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				rc := http.NewResponseController(w)
				for i, ev := range events {
					if i == held {
						_ = rc.Flush() // what came so far reaches the api while the answer is held
						select {
						case <-clientGone:
						case <-r.Context().Done():
							return
						}
					}
					if tc.paced > 0 && i > 0 {
						time.Sleep(tc.paced) // the upstream's pace, not a wait for a condition
					}
					if _, err := w.Write(ev); err != nil {
						return
					}
					if tc.paced > 0 {
						_ = rc.Flush()
					}
				}
			}))
			defer up.Close()
			prov, err := llm.NewOpenAI(llm.OpenAIConfig{BaseURL: up.URL + "/v1"})
			if err != nil {
				t.Fatal(err)
			}
			log := &endLog{ended: make(chan struct{})}
			h, err := stream.New(stream.Config{MaxBodyBytes: 1024, Limits: protocol.DefaultLimits, Heartbeat: time.Hour,
				DirectPathEnabled: true, ResumeWindow: time.Hour, LogTTL: 2 * time.Hour},
				stream.Deps{Pool: &fakePool{free: 2}, Provider: tc.wrap(prov), Gate: &fakeGate{}, Log: testutil.DiscardLogger(), LogWriter: log})
			if err != nil {
				t.Fatal(err)
			}
			api := httptest.NewServer(h)
			defer api.Close()

			ctx, cancel := context.WithCancel(t.Context())
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, api.URL+"/v1/stream", strings.NewReader(validBody))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			var got []string // the data lines the client read
			sc := bufio.NewScanner(resp.Body)
			for len(got) < read && sc.Scan() {
				if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
					got = append(got, d)
				}
			}
			cancel()
			resp.Body.Close()
			close(clientGone)
			if len(got) < read {
				t.Fatalf("the client read %d events before the answer ended: %v", len(got), sc.Err())
			}
			select {
			case <-log.ended:
			case <-time.After(20 * time.Second):
				t.Fatal("the detached stream never logged its end")
			}
			log.mu.Lock()
			evs := append([]streamlog.Event(nil), log.events...)
			log.mu.Unlock()
			var text strings.Builder
			for i, ev := range evs {
				if ev.ID != int64(i+1) {
					t.Fatalf("event %d has id %d: ids not 1, 2, 3, …", i, ev.ID)
				}
				if i < len(got) && string(ev.Data) != got[i] {
					t.Fatalf("event %d: the client read %q, the log has %q", ev.ID, got[i], ev.Data)
				}
				if ev.Name == "" {
					var c struct{ Content string }
					if err := json.Unmarshal(ev.Data, &c); err != nil {
						t.Fatalf("event %d: %v", ev.ID, err)
					}
					text.WriteString(c.Content)
				}
			}
			if last := evs[len(evs)-1]; last.Name != protocol.EventDone {
				t.Fatalf("the log ends with %q %s, want done", last.Name, last.Data)
			}
			if text.String() != want.String() {
				t.Fatalf("the log's chunks:\n%q\nwant\n%q", text.String(), want.String())
			}
		})
	}
}
