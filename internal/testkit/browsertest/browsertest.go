// Package browsertest runs browser tests in a real headless Chromium
// (Debian's chromium, which `make deps` installs) through chromedp: one
// browser per test package, started on first use and killed when the
// package's tests end, and a fresh isolated tab (own cookies and storage)
// per test, bounded by a deadline.
//
// A test package uses it from TestMain:
//
//	func TestMain(m *testing.M) { os.Exit(browsertest.Main(m)) }
//
// and from a test:
//
//	ctx := browsertest.Tab(t, 30*time.Second)
//	err := chromedp.Do(ctx, chromedp.Navigate(url))
package browsertest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// ExecPath is where Debian's chromium package puts the browser. The
// CHROMIUM environment variable overrides it.
const ExecPath = "/usr/bin/chromium"

// startTimeout bounds the launch. Chromium starts in about 0.7 s on an
// idle machine but took 9-12 s on a CI box with a load of 28 on 2 cores;
// a launch that takes minutes is broken, not slow.
const startTimeout = 90 * time.Second

// flags are the launch flags for a headless browser running as root on a
// closed network: no sandbox (root), no GPU, and none of the background
// traffic (updates, sync, safe browsing) that would only wait for a network
// that is not there. /dev/shm is small in containers, hence
// disable-dev-shm-usage.
var flags = []chromedp.ExecAllocatorOption{
	chromedp.Flag("headless", true),
	chromedp.Flag("no-sandbox", true),
	chromedp.Flag("disable-gpu", true),
	chromedp.Flag("disable-background-networking", true),
	chromedp.Flag("disable-component-update", true),
	chromedp.Flag("disable-sync", true),
	chromedp.Flag("no-first-run", true),
	chromedp.Flag("disable-dev-shm-usage", true),
	chromedp.Flag("no-default-browser-check", true),
	chromedp.Flag("disable-extensions", true),
	chromedp.Flag("hide-scrollbars", true),
	chromedp.Flag("mute-audio", true),
	chromedp.WindowSize(1280, 900),
}

// Browser is one running headless Chromium.
type Browser struct {
	ctx         context.Context // holds the browser; tabs are its children
	cancel      context.CancelFunc
	cancelAlloc context.CancelFunc
	proc        *os.Process
}

// Start launches a headless Chromium. Close ends it.
func Start() (*Browser, error) {
	path := ExecPath
	if p := os.Getenv("CHROMIUM"); p != "" {
		path = p
	}
	if _, err := exec.LookPath(path); err != nil {
		return nil, fmt.Errorf("browsertest: no browser at %s (make deps installs Debian's chromium): %w", path, err)
	}
	opts := append([]chromedp.ExecAllocatorOption{chromedp.ExecPath(path)}, flags...)
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(allocCtx)
	b := &Browser{ctx: ctx, cancel: cancel, cancelAlloc: cancelAlloc}
	// The first action on a context launches the browser and ties its life
	// to that context, so the launch runs on ctx itself; the deadline is
	// enforced by a timer that cancels it.
	launched := make(chan error, 1)
	go func() { launched <- chromedp.Do(ctx) }()
	select {
	case err := <-launched:
		if err != nil {
			b.Close()
			return nil, fmt.Errorf("browsertest: launch %s: %w", path, err)
		}
	case <-time.After(startTimeout):
		b.Close()
		return nil, fmt.Errorf("browsertest: launch %s: not within %v", path, startTimeout)
	}
	if c := chromedp.FromContext(ctx); c != nil && c.Browser != nil {
		b.proc = c.Browser.Process()
	}
	return b, nil
}

// PID is the browser process's id, 0 when unknown.
func (b *Browser) PID() int {
	if b.proc == nil {
		return 0
	}
	return b.proc.Pid
}

// Close ends the browser: its contexts are cancelled, which closes the
// browser, and the process is killed by its PID should it still be alive
// (a hung browser must not outlive the tests).
func (b *Browser) Close() {
	b.cancel()
	done := make(chan struct{})
	go func() { b.cancelAlloc(); close(done) }() // waits for the process
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		if b.proc != nil {
			_ = b.proc.Kill()
		}
		<-done
	}
}

// Tab opens a new tab in its own browser context (no cookies or storage
// shared with other tests) with the given deadline for everything the
// test does in it. The tab closes when the test ends.
func (b *Browser) Tab(tb testing.TB, deadline time.Duration) context.Context {
	tb.Helper()
	tabCtx, closeTab := chromedp.NewContext(b.ctx, chromedp.WithNewBrowserContext())
	ctx, cancel := context.WithTimeout(tabCtx, deadline)
	tb.Cleanup(func() {
		cancel()
		closeTab()
	})
	if err := chromedp.Do(ctx); err != nil {
		tb.Fatalf("browsertest: open tab: %v", err)
	}
	return ctx
}

// shared is the test package's browser, started by the first Tab call.
var shared struct {
	mu  sync.Mutex
	b   *Browser
	err error
}

// Tab opens a tab of the test package's shared browser, launching the
// browser on first use; see Browser.Tab. A package that calls it must run
// its tests through Main, which ends the browser.
func Tab(tb testing.TB, deadline time.Duration) context.Context {
	tb.Helper()
	shared.mu.Lock()
	if shared.b == nil && shared.err == nil {
		shared.b, shared.err = Start()
	}
	b, err := shared.b, shared.err
	shared.mu.Unlock()
	if err != nil {
		tb.Fatal(err)
	}
	return b.Tab(tb, deadline)
}

// Main runs the package's tests, then ends the shared browser if one was
// started. Use it as `os.Exit(browsertest.Main(m))` in TestMain.
func Main(m *testing.M) int {
	code := m.Run()
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.b != nil {
		shared.b.Close()
		shared.b = nil
	}
	return code
}

// Until waits until the JavaScript expression expr is truthy in the tab,
// checking on every animation frame, and fails the test if the tab's
// deadline passes first; the failure shows what was awaited and the page's
// text at that moment.
func Until(tb testing.TB, ctx context.Context, expr, what string) {
	tb.Helper()
	if _, err := chromedp.Run(ctx, chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingTimeout(0))); err != nil {
		tb.Fatalf("browsertest: waiting for %s (%s): %v\npage text: %q", what, expr, err, pageText(ctx))
	}
}

// Eval evaluates expr in the tab and decodes its value, failing the test on
// an error.
func Eval[T any](tb testing.TB, ctx context.Context, expr string) T {
	tb.Helper()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		tb.Fatalf("browsertest: evaluate %s: %v", expr, err)
	}
	return v
}

// pageText is the body's text for failure messages, best effort: the tab
// may be past its deadline, so a short context of its own is used.
func pageText(ctx context.Context) string {
	c := chromedp.FromContext(ctx)
	if c == nil {
		return ""
	}
	short, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	s, err := chromedp.Run(short, chromedp.Evaluate[string](`document.body ? document.body.innerText : ""`))
	if err != nil {
		return "(unavailable: " + err.Error() + ")"
	}
	return s
}
