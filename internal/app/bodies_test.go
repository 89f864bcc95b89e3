package app

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"strings"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

// openBody sends the head of a POST /v1/stream announcing a body of n
// bytes and only its first byte, so the api holds the body's share of
// BODY_BYTES_IN_FLIGHT while it waits for the rest. Closing the returned
// connection is the client going away mid-body.
func openBody(t *testing.T, url string, n int) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	head := fmt.Sprintf("POST /v1/stream HTTP/1.1\r\nHost: spillway\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{", n)
	if _, err := conn.Write([]byte(head)); err != nil {
		t.Fatal(err)
	}
	return conn
}

// paddedPrompt is a request body of about n bytes.
func paddedPrompt(n int) map[string]any { return prompt(strings.Repeat("y", n)) }

// BODY_BYTES_IN_FLIGHT, against a real Redis: bodies being read count
// from their Content-Length; a request that does not fit is refused 503
// bodies-in-flight with Retry-After before its body is read; a client that
// leaves mid-body gives its share back; a queued request's body is given
// back once its job is enqueued, so waiting streams whose bodies add up to
// more than the bound all wait.
func TestBodiesInFlightBoundAndQueuedRelease(t *testing.T) {
	t.Parallel()
	const maxBody, bound = 64 << 10, 128 << 10
	c := newCluster(t, fastSim(), map[string]string{
		"DIRECT_PATH_ENABLED": "false", "QUEUE_FAILOVER_TIMEOUT_SECONDS": "60", "STREAM_RESUME_WINDOW_SECONDS": "0",
		"MAX_BODY_BYTES": fmt.Sprint(maxBody), "BODY_BYTES_IN_FLIGHT": fmt.Sprint(bound), "QUEUE_MAX_BYTES": fmt.Sprint(1 << 20),
	})
	a, url := c.api(nil)
	held := a.handler.BodyBytesHeld
	heldIs := func(want int64, what string) {
		t.Helper()
		testutil.Eventually(t, 5*time.Second, func() bool { return held() == want }, fmt.Sprintf("%s: body bytes held %d, want %d", what, held(), want))
	}

	// Two bodies being read hold 2 × 60,000 of the 131,072.
	const partial = 60000
	first := openBody(t, url, partial)
	second := openBody(t, url, partial)
	heldIs(2*partial, "two bodies being read")

	// One more of 20 KB does not fit: refused before it is read.
	resp := postStream(t, t.Context(), url, paddedPrompt(20000), map[string]string{"X-User-ID": "late"})
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "1" {
		resp.Body.Close()
		t.Fatalf("over the bound: HTTP %d Retry-After %q, want 503 with Retry-After 1", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if p := readProblem(t, resp); p.Type != protocol.ProblemTypeBase+protocol.ProblemBodiesInFlight || p.RetryAfterSeconds != 1 {
		t.Fatalf("over the bound: problem %+v, want bodies-in-flight, retry after 1 s", p)
	}
	if got := held(); got != 2*partial {
		t.Fatalf("a refusal changed the bytes held: %d, want %d", got, 2*partial)
	}

	// The client of the first leaves mid-body: its share comes back.
	first.Close()
	heldIs(partial, "a client left mid-body")

	// Queued requests whose bodies add up to three times the bound all
	// wait: each body is given back once its job is enqueued, by the time
	// the stream's head arrives.
	const waiting = 6
	for i := range waiting {
		ctx, cancel := context.WithCancel(t.Context())
		resp := postStream(t, ctx, url, paddedPrompt(maxBody-1024), map[string]string{"X-User-ID": fmt.Sprint("w", i)})
		t.Cleanup(func() { cancel(); resp.Body.Close() })
		if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Stream-Path") != protocol.PathQueued {
			t.Fatalf("waiting stream %d: HTTP %d path %q, want a queued stream", i, resp.StatusCode, resp.Header.Get("X-Stream-Path"))
		}
		if got := held(); got != partial {
			t.Fatalf("waiting stream %d open: body bytes held %d, want only the body still being read (%d)", i, got, partial)
		}
	}
	if n := c.backlog(); n != waiting {
		t.Fatalf("backlog %d, want %d waiting jobs", n, waiting)
	}

	// The last body being read: its client leaves too, and nothing is held.
	second.Close()
	heldIs(0, "both clients left mid-body")
}

// The direct path holds a body's share until its answer ended, and gives
// it back then, or when its client leaves mid-answer; with the bound at
// one body, a second request meanwhile is refused 503 bodies-in-flight.
func TestBodiesInFlightDirectRelease(t *testing.T) {
	t.Parallel()
	const maxBody = 64 << 10
	// 24 chunks 40 ms apart: an answer of about a second.
	slow := llm.SimConfig{FirstToken: time.Millisecond, TokenInterval: 40 * time.Millisecond, Tokens: 24, Seed: 7}
	c := newCluster(t, slow, map[string]string{
		"MAX_BODY_BYTES": fmt.Sprint(maxBody), "BODY_BYTES_IN_FLIGHT": fmt.Sprint(maxBody), "STREAM_RESUME_WINDOW_SECONDS": "0",
	})
	a, url := c.api(nil)
	held := a.handler.BodyBytesHeld

	// openDirect opens a direct stream of a 40 KB body, waits for its
	// first chunk and returns its reader.
	openDirect := func(ctx context.Context, user string) (*http.Response, *bufio.Reader) {
		t.Helper()
		resp := postStream(t, ctx, url, paddedPrompt(40000), map[string]string{"X-User-ID": user})
		t.Cleanup(func() { resp.Body.Close() })
		if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Stream-Path") != protocol.PathDirect {
			t.Fatalf("%s: HTTP %d path %q, want a direct stream", user, resp.StatusCode, resp.Header.Get("X-Stream-Path"))
		}
		br := bufio.NewReader(resp.Body)
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				t.Fatalf("%s: stream ended before its first chunk: %v", user, err)
			}
			if strings.HasPrefix(line, "data: ") {
				return resp, br
			}
		}
	}

	// An answer under way holds its body; another body does not fit.
	resp, br := openDirect(t.Context(), "first")
	if got := held(); got < 40000 {
		t.Fatalf("direct answer under way: body bytes held %d, want its body (> 40,000)", got)
	}
	refused := postStream(t, t.Context(), url, paddedPrompt(40000), map[string]string{"X-User-ID": "second"})
	if p := readProblem(t, refused); p.Type != protocol.ProblemTypeBase+protocol.ProblemBodiesInFlight || refused.Header.Get("Retry-After") != "1" {
		t.Fatalf("second body during the answer: problem %+v Retry-After %q, want bodies-in-flight, 1", p, refused.Header.Get("Retry-After"))
	}
	// Read the answer to its end: the body comes back with it.
	var sawDone bool
	for {
		line, err := br.ReadString('\n')
		if line == "event: done\n" {
			sawDone = true
		}
		if err != nil {
			break
		}
	}
	resp.Body.Close()
	if !sawDone {
		t.Fatal("the first answer did not end in done")
	}
	testutil.Eventually(t, 5*time.Second, func() bool { return held() == 0 }, "body given back after the direct answer ended")

	// A client that leaves mid-answer gives its body back too.
	ctx, cancel := context.WithCancel(t.Context())
	openDirect(ctx, "leaver")
	if got := held(); got < 40000 {
		t.Fatalf("second direct answer under way: body bytes held %d, want its body", got)
	}
	cancel()
	testutil.Eventually(t, 5*time.Second, func() bool { return held() == 0 }, "body given back after the client left mid-answer")
}

// A direct request handed to the queue after a retryable upstream failure
// (docs/API.md, "Hand-off to the queue") gives its body back once its job
// is enqueued, not when its stream ends: with the bound at one body,
// another body fits while the handed-off stream waits for a worker, and
// both answers complete once one runs, with nothing held after them.
func TestBodiesInFlightHandOffRelease(t *testing.T) {
	t.Parallel()
	const maxBody = 64 << 10
	sc := fastSim()
	sc.FailFirst = 1                      // the direct call fails before its first chunk
	sc.FailStatus = http.StatusBadGateway // a server error: sub-second delay before the hand-off
	c := newCluster(t, sc, map[string]string{
		"MAX_BODY_BYTES": fmt.Sprint(maxBody), "BODY_BYTES_IN_FLIGHT": fmt.Sprint(maxBody),
		"STREAM_RESUME_WINDOW_SECONDS": "0", "QUEUE_FAILOVER_TIMEOUT_SECONDS": "120",
	})
	binary(t, "consumer") // built before the jobs wait, not while they do
	a, url := c.api(nil)
	held := a.handler.BodyBytesHeld

	first := postStream(t, t.Context(), url, paddedPrompt(40000), map[string]string{"X-User-ID": "first"})
	defer first.Body.Close()
	if first.StatusCode != http.StatusOK || first.Header.Get("X-Stream-Path") != protocol.PathDirect {
		t.Fatalf("first: HTTP %d path %q, want a direct stream", first.StatusCode, first.Header.Get("X-Stream-Path"))
	}
	br := bufio.NewReader(first.Body)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("first: stream ended before its retrying event: %v", err)
		}
		if line == "event: retrying\n" {
			break
		}
	}
	testutil.Eventually(t, 5*time.Second, func() bool { return c.backlog() == 1 }, "the handed-off job enqueued")
	testutil.Eventually(t, 5*time.Second, func() bool { return held() == 0 },
		fmt.Sprintf("handed-off job enqueued, its stream waiting: body bytes held %d, want 0", held()))

	// Another body of the same size fits while the first stream waits.
	second := postStream(t, t.Context(), url, paddedPrompt(40000), map[string]string{"X-User-ID": "second"})
	defer second.Body.Close()
	if second.StatusCode != http.StatusOK {
		t.Fatalf("second body while the handed-off stream waits: %+v, want it taken", readProblem(t, second))
	}

	// The first is answered from the queue; the second, direct or queued
	// behind it, completes too.
	c.consumer(nil)
	for name, r := range map[string]io.Reader{"first": br, "second": second.Body} {
		var done, last string
		lines := bufio.NewScanner(r)
		for lines.Scan() {
			if lines.Text() != "" {
				last = lines.Text()
			}
			if lines.Text() == "event: done" && lines.Scan() {
				done = lines.Text()
			}
		}
		if done == "" || (name == "first" && !strings.Contains(done, `"path":"queued"`)) {
			t.Fatalf("%s: done %q (last line %q), want a whole answer (the first's from the queue)", name, done, last)
		}
	}
	testutil.Eventually(t, 5*time.Second, func() bool { return held() == 0 }, fmt.Sprintf("after both answers: body bytes held %d, want 0", held()))
}

// A request refused for BODY_BYTES_IN_FLIGHT with a body far larger than
// the 256 KiB net/http drains by itself (a 1 MiB image) gets its 503 on a
// connection kept alive: the refused body is read to its end into no
// memory, so the client neither sees a reset while it still sends nor
// needs a new connection for its retry. And a body announced over
// MAX_BODY_BYTES is refused 413 before a byte is read.
func TestBodiesInFlightRefusalKeepsConnection(t *testing.T) {
	t.Parallel()
	const maxBody = 2 << 20
	_, url, _ := startAPI(t, testConfig(t, map[string]string{
		"MAX_BODY_BYTES": fmt.Sprint(maxBody), "BODY_BYTES_IN_FLIGHT": fmt.Sprint(maxBody),
	}))
	// A body being read holds all but 64 KiB of the bound.
	openBody(t, url, maxBody-64<<10)

	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
	t.Cleanup(client.CloseIdleConnections)
	image := `{"messages":[{"role":"user","content":"` + strings.Repeat("A", 1<<20) + `"}]}`
	post := func(body string) (*http.Response, bool) {
		t.Helper()
		reused := false
		ctx := httptrace.WithClientTrace(t.Context(), &httptrace.ClientTrace{
			GotConn: func(info httptrace.GotConnInfo) { reused = info.Reused },
		})
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/stream", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("POST of %d bytes: %v (a refusal must reach the client)", len(body), err)
		}
		return resp, reused
	}
	for i := range 3 {
		resp, reused := post(image)
		if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "1" {
			resp.Body.Close()
			t.Fatalf("refusal %d: HTTP %d Retry-After %q, want 503 with Retry-After 1", i, resp.StatusCode, resp.Header.Get("Retry-After"))
		}
		if p := readProblem(t, resp); p.Type != protocol.ProblemTypeBase+protocol.ProblemBodiesInFlight {
			t.Fatalf("refusal %d: problem %+v, want bodies-in-flight", i, p)
		}
		if i > 0 && !reused {
			t.Fatalf("refusal %d came on a new connection: the refused body closed the last one", i)
		}
	}

	resp, _ := post(`{"messages":[{"role":"user","content":"` + strings.Repeat("A", maxBody) + `"}]}`)
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		resp.Body.Close()
		t.Fatalf("a body over MAX_BODY_BYTES: HTTP %d, want 413", resp.StatusCode)
	}
	readProblem(t, resp)
}
