package app

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/protocol"
)

// keyLimitRoutes are both endpoints a key's limits hold on.
var keyLimitRoutes = []string{"/v1/stream", "/v1/chat/completions"}

// postAs posts a streamed request for text to url+route with key (none
// when empty) and X-User-ID user (none when empty); cancel ends it.
func postAs(t *testing.T, url, route, key, user, text string) (*http.Response, context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	body, _ := json.Marshal(map[string]any{"stream": true, "messages": userMsgs(text)})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+route, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	if user != "" {
		req.Header.Set("X-User-ID", user)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		t.Fatalf("POST %s: %v", route, err)
	}
	t.Cleanup(func() { cancel(); resp.Body.Close() })
	return resp, cancel
}

// tally counts answers by what they were: the path of a 200, else the
// status.
type tally map[string]int

func (c tally) add(resp *http.Response) {
	if resp.StatusCode == http.StatusOK {
		c[resp.Header.Get("X-Stream-Path")]++
		return
	}
	c[fmt.Sprint(resp.StatusCode)]++
}

// keyName is the identity of API key key (docs/API.md, "Identity").
func keyName(key string) string {
	sum := sha256.Sum256([]byte(key))
	return "key:" + hex.EncodeToString(sum[:])[:12]
}

// slowSim answers so slowly that every stream holds its slot for the test.
func slowSim() llm.SimConfig {
	return llm.SimConfig{FirstToken: 10 * time.Millisecond, TokenInterval: time.Second, Tokens: 60, Seed: 5}
}

// One key sending 40 requests as 40 X-User-IDs, on both endpoints, is held
// to its own limits together (issue 29): CONNECTION_POOL_PER_USER=2 direct
// streams, QUEUE_MAX_PER_IDENTITY=5 queued jobs, the rest 429; another key
// then still streams directly, and its queue place is its own.
func TestKeyLimitsBoundItsUsers(t *testing.T) {
	t.Parallel()
	c := newCluster(t, slowSim(), map[string]string{
		"API_KEYS": "key-a,key-b", "CONNECTION_POOL_SIZE": "20", "CONNECTION_POOL_PER_USER": "2",
		"QUEUE_MAX_PER_IDENTITY": "5", "QUEUE_FAILOVER_TIMEOUT_SECONDS": "60", "STREAM_RESUME_WINDOW_SECONDS": "0",
		// A queued chat completion's 200 waits for its first write: a ping.
		"HEARTBEAT_INTERVAL_SECONDS": "1",
	})
	_, url := c.api(nil)
	got := tally{}
	for i := range 40 {
		resp, _ := postAs(t, url, keyLimitRoutes[i%2], "key-a", fmt.Sprintf("user-%d", i), fmt.Sprintf("a %d", i))
		got.add(resp)
	}
	want := tally{protocol.PathDirect: 2, protocol.PathQueued: 5, "429": 33}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("40 users of one key: %v, want %v (the key's 2 slots, 5 queue places)", got, want)
	}
	if n := c.quotaCount(keyName("key-a")); n != 5 {
		t.Fatalf("quota counts %d jobs of key-a, want 5", n)
	}
	for i, route := range keyLimitRoutes {
		resp, _ := postAs(t, url, route, "key-b", "user-0", fmt.Sprintf("b %d", i))
		if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Stream-Path") != protocol.PathDirect {
			t.Fatalf("key-b on %s beside a full key-a: HTTP %d path %q, want direct", route, resp.StatusCode, resp.Header.Get("X-Stream-Path"))
		}
	}
	resp, _ := postAs(t, url, "/v1/stream", "key-b", "user-1", "b queued")
	if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Stream-Path") != protocol.PathQueued {
		t.Fatalf("key-b's third request: HTTP %d path %q, want queued", resp.StatusCode, resp.Header.Get("X-Stream-Path"))
	}
}

// Without API_KEYS, X-User-IDs are identities of their own as before: each
// user has its own slots and queue places.
func TestUserIDsWithoutKeysKeepTheirOwnLimits(t *testing.T) {
	t.Parallel()
	c := newCluster(t, slowSim(), map[string]string{
		"CONNECTION_POOL_SIZE": "20", "CONNECTION_POOL_PER_USER": "1",
		"QUEUE_MAX_PER_IDENTITY": "1", "QUEUE_FAILOVER_TIMEOUT_SECONDS": "60", "STREAM_RESUME_WINDOW_SECONDS": "0",
		// A queued chat completion's 200 waits for its first write: a ping.
		"HEARTBEAT_INTERVAL_SECONDS": "1",
	})
	_, url := c.api(nil)
	got := tally{}
	for i := range 10 {
		for j := range 3 {
			resp, _ := postAs(t, url, keyLimitRoutes[(j+1)%2], "", fmt.Sprintf("user-%d", i), fmt.Sprintf("%d %d", i, j))
			got.add(resp)
		}
	}
	want := tally{protocol.PathDirect: 10, protocol.PathQueued: 10, "429": 10}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("10 users, 3 requests each: %v, want %v", got, want)
	}
}

// RATE_LIMIT_BURST=3 for a key is 3 requests of all its users together;
// another key has its own allowance.
func TestKeyRateLimitBoundsItsUsers(t *testing.T) {
	t.Parallel()
	c := newCluster(t, fastSim(), map[string]string{
		"API_KEYS": "key-a,key-b", "RATE_LIMIT_RPS": "0.01", "RATE_LIMIT_BURST": "3",
	})
	_, url := c.api(nil)
	got := tally{}
	for i := range 40 {
		resp, cancel := postAs(t, url, keyLimitRoutes[i%2], "key-a", fmt.Sprintf("user-%d", i), fmt.Sprintf("a %d", i))
		got.add(resp)
		cancel()
	}
	if got["429"] != 37 || got[protocol.PathDirect]+got[protocol.PathQueued] != 3 {
		t.Fatalf("40 users of one key under a burst of 3: %v, want 3 admitted and 37 429", got)
	}
	resp, _ := postAs(t, url, "/v1/chat/completions", "key-b", "user-0", "b")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("key-b beside a limited key-a: HTTP %d", resp.StatusCode)
	}
}
