package loadtest

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

// Streams held open spread over the backends by the requests in flight
// (least connections, not turns), each event reaches the client while its
// stream is still open, and the path, query and headers reach the
// backend.
func TestBalancerLeastConnectionsAndStreaming(t *testing.T) {
	t.Parallel()
	var urls []string
	for i := range 2 {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			// As the api does: the whole body, then the stream.
			if _, err := io.Copy(io.Discard, r.Body); err != nil {
				t.Errorf("backend %d: body: %v", i, err)
			}
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprintf(w, "data: backend %d %s %s %s\n\n", i, r.URL.Path, r.URL.RawQuery, r.Header.Get("X-User-ID"))
			w.(http.Flusher).Flush()
			<-r.Context().Done() // open until the client leaves
		}))
		t.Cleanup(srv.Close)
		urls = append(urls, srv.URL)
	}
	b, err := NewBalancer(urls)
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewServer(b)
	t.Cleanup(front.Close)

	type stream struct {
		backend string
		body    io.ReadCloser
	}
	open := func(i int) stream {
		t.Helper()
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, front.URL+"/v1/stream?x=1", strings.NewReader("{}"))
		req.Header.Set("X-User-ID", fmt.Sprint("u", i))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		// The first event arrives while the backend holds the stream open.
		line, err := bufio.NewReader(resp.Body).ReadString('\n')
		if err != nil {
			t.Fatalf("stream %d: first event: %v", i, err)
		}
		if want := fmt.Sprintf("/v1/stream x=1 u%d\n", i); !strings.HasSuffix(line, want) {
			t.Fatalf("stream %d: %q, want path, query and header %q", i, line, want)
		}
		return stream{backend: strings.Fields(line)[2], body: resp.Body}
	}
	var streams []stream
	for i := range 4 {
		streams = append(streams, open(i))
	}
	if got := b.InFlight(); !slices.Equal(got, []int64{2, 2}) {
		t.Fatalf("in flight %v with 4 streams open, want 2 on each", got)
	}
	// Backend 0's streams end: the next two both go there.
	for _, s := range streams {
		if s.backend == "0" {
			s.body.Close()
		}
	}
	testutil.Eventually(t, 5*time.Second, func() bool { return slices.Equal(b.InFlight(), []int64{0, 2}) }, "backend 0 idle")
	for i := 4; i < 6; i++ {
		if s := open(i); s.backend != "0" {
			t.Fatalf("stream %d went to backend %s with backend 0 idle", i, s.backend)
		}
	}
	if got := b.InFlight(); !slices.Equal(got, []int64{2, 2}) {
		t.Fatalf("in flight %v, want 2 on each", got)
	}
}

func TestBalancerBadBackends(t *testing.T) {
	t.Parallel()
	for _, backends := range [][]string{nil, {"127.0.0.1:8080"}, {"ftp://127.0.0.1"}, {"http://"}} {
		if _, err := NewBalancer(backends); err == nil {
			t.Errorf("NewBalancer(%q) accepted", backends)
		}
	}
	// A backend that refuses connections is a 502, not a hang.
	dead := httptest.NewServer(http.NotFoundHandler())
	dead.Close()
	b, err := NewBalancer([]string{dead.URL})
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewServer(b)
	t.Cleanup(front.Close)
	resp, err := http.Get(front.URL + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("dead backend: HTTP %d, want 502", resp.StatusCode)
	}
}
