package app

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"runtime"
	"runtime/metrics"
	"runtime/pprof"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/internal/llm"
)

// BenchmarkWaitingStreamMemory measures what one waiting stream holds in
// the api (docs/bench-history/2026-11.md, "Waiting streams"): WAITING_N (default
// 2,000) streams are opened over raw TCP connections against an api with
// no consumer, so every one waits in the queue, and once each has its
// headers and a first heartbeat the process's goroutines, goroutine stacks
// and live heap (after two collections, which also shrink the stacks) are
// compared with what they were before. Reported per stream: goroutines,
// stack bytes and live heap bytes, and the stacks again after one more
// heartbeat each without a collection (a heartbeat that needs a deeper
// stack than the one left after shrinking grows it back).
//
// The clients are in the process too: a raw connection costs a few hundred
// bytes of heap (its netFD), which the heap figure includes. With
// WAITING_HEAP_PROFILE=<file> a heap profile of the plateau is written
// (run with -memprofilerate=1 for exact figures per allocation site).
//
// With WAITING_IMAGE_BYTES=<n> every request carries an inline image of n
// base64 bytes (a photo, as a chat client sends it): once its job is
// enqueued the api gives the body back (BODY_BYTES_IN_FLIGHT), so the
// figures per stream must not grow with n. Redis then holds n bytes per
// stream.
//
//	go test ./internal/app -run '^$' -bench WaitingStreamMemory -benchtime 1x
//	WAITING_IMAGE_BYTES=1048576 go test ./internal/app -run '^$' -bench WaitingStreamMemory -benchtime 1x
func BenchmarkWaitingStreamMemory(b *testing.B) {
	n := 2000
	if s := os.Getenv("WAITING_N"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 1 {
			b.Fatalf("WAITING_N=%q", s)
		}
		n = v
	}
	image := 0
	if s := os.Getenv("WAITING_IMAGE_BYTES"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 0 || v > 15<<20 {
			b.Fatalf("WAITING_IMAGE_BYTES=%q: want 0 to 15 MiB", s)
		}
		image = v
	}
	url := startWaitingAPI(b, n, map[string]string{"QUEUE_MAX_BYTES": strconv.Itoa(max(1<<28, 2*n*(image+4096)))})
	for b.Loop() {
		w := openWaitingBody(b, url, n, "HTTP/1.1", os.Getenv("WAITING_HEAP_PROFILE"), waitingBody(image))
		b.ReportMetric(w.perStream(w.plateau.goroutines), "goroutines/stream")
		b.ReportMetric(w.perStream(w.plateau.stack), "stack-B/stream")
		b.ReportMetric(w.perStream(w.pinged.stack), "stack-after-ping-B/stream")
		b.ReportMetric(w.perStream(w.plateau.heap), "heap-B/stream")
		b.ReportMetric(float64(w.plateau.startStack), "start-stack-B")
		w.close()
	}
}

// startWaitingAPI starts an api with no consumer, where up to n streams
// wait in the queue (for 600 s), with a heartbeat every second.
func startWaitingAPI(tb testing.TB, n int, extra map[string]string) string {
	tb.Helper()
	env := map[string]string{
		"DIRECT_PATH_ENABLED": "false", "CONNECTION_POOL_SIZE": "1",
		"QUEUE_FAILOVER_TIMEOUT_SECONDS": "600", "HEARTBEAT_INTERVAL_SECONDS": "1",
		"QUEUE_OVERFLOW_THRESHOLD": strconv.Itoa(4 * n), "QUEUE_MAX_PER_IDENTITY": strconv.Itoa(4 * n),
	}
	for k, v := range extra {
		env[k] = v
	}
	c := newCluster(tb, llm.SimConfig{Tokens: 4, Seed: 1}, env)
	_, url := c.api(nil)
	return url
}

// waiting is n streams waiting on one api, over raw connections, with the
// process's goroutines, stacks and heap before, once every stream had a
// heartbeat (after two collections: plateau), and after one more
// heartbeat each without a collection in between (pinged).
type waiting struct {
	n                       int
	conns                   []net.Conn
	before, plateau, pinged memSample
}

func (w *waiting) perStream(v uint64) float64 {
	return float64(v) / float64(w.n)
}

func (w *waiting) close() {
	for _, cn := range w.conns {
		_ = cn.Close()
	}
}

// openWaiting opens n streams over proto (HTTP/1.1, or HTTP/1.0, whose
// streams are never taken over from net/http) against the api at url and
// samples memory; with heapProfile set, it writes the plateau's heap
// profile there. The samples it keeps are the differences from before.
func openWaiting(tb testing.TB, url string, n int, proto, heapProfile string) *waiting {
	tb.Helper()
	return openWaitingBody(tb, url, n, proto, heapProfile, waitingBody(0))
}

// waitingBody is a waiting stream's request, with an inline image of
// image base64 bytes when positive.
func waitingBody(image int) string {
	if image <= 0 {
		return `{"prompt":"wait"}`
	}
	return `{"messages":[{"role":"user","content":[{"type":"text","text":"wait"},` +
		`{"type":"image_url","image_url":{"url":"data:image/png;base64,` + strings.Repeat("iVBO", (image+3)/4) + `"}}]}]}`
}

// openWaitingBody is openWaiting with the request body given.
func openWaitingBody(tb testing.TB, url string, n int, proto, heapProfile, body string) *waiting {
	tb.Helper()
	addr := strings.TrimPrefix(url, "http://")
	req := []byte("POST /v1/stream " + proto + "\r\nHost: " + addr + "\r\nContent-Type: application/json\r\n" +
		"Origin: https://chat.example.com\r\nX-User-ID: waiting\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body)
	w := &waiting{n: n, before: memNow(true)}
	tb.Cleanup(w.close)
	for range n {
		cn, err := net.Dial("tcp", addr)
		if err != nil {
			tb.Fatal(err)
		}
		w.conns = append(w.conns, cn)
		if _, err := cn.Write(req); err != nil {
			tb.Fatal(err)
		}
	}
	// Every stream is open (its headers arrived) and has sent a
	// heartbeat: its handler has been through the ping path once.
	buf := make([]byte, 4096)
	for i, cn := range w.conns {
		if err := readUntil(cn, buf, []byte(": ping")); err != nil {
			tb.Fatalf("stream %d: %v", i, err)
		}
	}
	w.plateau = memNow(true).minus(w.before)
	if heapProfile != "" {
		writeHeapProfile(tb, heapProfile)
	}
	// One more heartbeat each, without a collection in between.
	for i, cn := range w.conns {
		if err := readUntil(cn, buf, []byte(": ping")); err != nil {
			tb.Fatalf("stream %d: %v", i, err)
		}
	}
	w.pinged = memNow(false).minus(w.before)
	return w
}

type memSample struct {
	goroutines, stack, heap, startStack uint64
}

// minus is m less what was there before (the starting stack size is
// kept as it is).
func (m memSample) minus(before memSample) memSample {
	sub := func(a, b uint64) uint64 { return uint64(max(0, int64(a)-int64(b))) }
	return memSample{goroutines: sub(m.goroutines, before.goroutines), stack: sub(m.stack, before.stack),
		heap: sub(m.heap, before.heap), startStack: m.startStack}
}

// memNow reads goroutines, stack bytes in use and live heap bytes, after
// two collections when gc (the second one shrinks what the first left).
func memNow(gc bool) memSample {
	if gc {
		runtime.GC()
		runtime.GC()
	}
	s := []metrics.Sample{
		{Name: "/sched/goroutines:goroutines"},
		{Name: "/memory/classes/heap/stacks:bytes"},
		{Name: "/memory/classes/heap/objects:bytes"},
		{Name: "/gc/stack/starting-size:bytes"},
	}
	metrics.Read(s)
	return memSample{goroutines: s[0].Value.Uint64(), stack: s[1].Value.Uint64(), heap: s[2].Value.Uint64(),
		startStack: s[3].Value.Uint64()}
}

// readUntil reads cn until what it read contains want, within 30 s.
func readUntil(cn net.Conn, buf, want []byte) error {
	if err := cn.SetReadDeadline(time.Now().Add(30 * time.Second)); err != nil {
		return err
	}
	var got []byte
	for !bytes.Contains(got, want) {
		k, err := cn.Read(buf)
		if err != nil {
			return fmt.Errorf("read (after %q): %w", got, err)
		}
		got = append(got, buf[:k]...)
		if len(got) > 64<<10 {
			got = got[len(got)-1024:]
		}
	}
	return nil
}

func writeHeapProfile(tb testing.TB, path string) {
	tb.Helper()
	f, err := os.Create(path)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		tb.Fatal(err)
	}
}
