// Browser tests of resume and stop through the chat page (GET and DELETE
// /v1/streams/{id}, README "For frontend developers").

package web_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/spillway-dev/spillway/internal/testkit/browsertest"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

// Stop sends DELETE, which frees the slot at once even though the api
// would otherwise keep a disconnected stream generating for its resume
// window: a new request finds the only slot free within a second.
//
// Without a queue, so that a probe sent while the slot is still held is
// refused rather than queued: a queued probe would take the freed slot
// first (a waiting job goes before a newer direct request), hold it until
// its worker saw the probe's client gone, and the next probe would queue
// behind it in turn (CI once saw no direct answer for 5 s that way).
func TestChatPageStopFreesSlot(t *testing.T) {
	t.Parallel()
	url := startAPI(t, map[string]string{"CONNECTION_POOL_SIZE": "1", "SIM_TOKEN_MS": "300", "STREAM_RESUME_WINDOW_SECONDS": "30",
		"QUEUE_FAILOVER_ENABLED": "false"})
	ctx := openPage(t, url)
	ask(t, ctx, "a long answer, please")
	browsertest.Until(t, ctx, lastAnswer+`.textContent.length > 0`, "the first chunk")
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.ID("stop"))); err != nil {
		t.Fatal(err)
	}
	waitState(t, ctx, "error")
	stopped := time.Now()
	testutil.Eventually(t, 5*time.Second, func() bool {
		req, _ := http.NewRequest(http.MethodPost, url+"/v1/stream", strings.NewReader(`{"prompt":"next"}`))
		req.Header.Set("Content-Type", "application/json")
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		resp, err := http.DefaultClient.Do(req.WithContext(ctx))
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		return resp.StatusCode == http.StatusOK && resp.Header.Get("X-Stream-Path") == "direct"
	}, "the slot freed by Stop")
	if d := time.Since(stopped); d > time.Second {
		t.Errorf("the slot was free %v after Stop, want within 1s", d)
	}
	if s := statusText(t, ctx); s != "Stopped." {
		t.Errorf("status %q, want Stopped.", s)
	}
}

// A connection cut mid-answer (by a proxy between the browser and the api)
// is resumed by the page on its own, and the answer is the complete
// reference, each chunk once.
func TestChatPageResumesAfterDroppedConnection(t *testing.T) {
	t.Parallel()
	url := startAPI(t, map[string]string{"SIM_TOKEN_MS": "200"})
	p := startProxy(t, strings.TrimPrefix(url, "http://"))
	ctx := openPage(t, "http://"+p.addr)
	const q = "Please survive a dropped connection."
	ask(t, ctx, q)
	browsertest.Until(t, ctx, lastAnswer+`.textContent.length > 20`, "part of the answer")
	if n := p.dropAll(); n == 0 {
		t.Fatal("no connection to drop")
	}
	waitState(t, ctx, "done")
	if _, text := answer(t, ctx); text != reference(user(q)) {
		t.Fatalf("resumed answer %q,\nwant %q", text, reference(user(q)))
	}
}

// proxy relays TCP connections to an upstream and can cut them all.
type proxy struct {
	addr  string
	mu    sync.Mutex
	conns []net.Conn
}

func startProxy(t *testing.T, upstream string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{addr: ln.Addr().String()}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		ln.Close()
		p.dropAll()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", upstream)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, u)
			p.mu.Unlock()
			wg.Go(func() { _, _ = io.Copy(u, c); u.Close() })
			wg.Go(func() { _, _ = io.Copy(c, u); c.Close() })
		}
	})
	return p
}

// dropAll closes every relayed connection and reports how many pairs.
func (p *proxy) dropAll() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0) // a reset, as a mobile network gives
		}
		_ = c.Close()
	}
	n := len(p.conns) / 2
	p.conns = nil
	return n
}
