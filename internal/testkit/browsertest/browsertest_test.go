package browsertest_test

import (
	"net/http"
	"net/http/httptest"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/spillway-dev/spillway/internal/testkit/browsertest"
)

func TestMain(m *testing.M) { os.Exit(browsertest.Main(m)) }

// A started browser runs pages in a tab, and Close leaves no process.
func TestStartTabClose(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		_, _ = w.Write([]byte(`<title>hello</title><p id=x></p><script>setTimeout(() => { document.getElementById("x").textContent = "later" }, 50)</script>`))
	}))
	defer srv.Close()

	b, err := browsertest.Start()
	if err != nil {
		t.Fatal(err)
	}
	pid := b.PID()
	if pid <= 0 || syscall.Kill(pid, 0) != nil {
		b.Close()
		t.Fatalf("browser pid %d not alive", pid)
	}
	ctx := b.Tab(t, 20*time.Second)
	if err := chromedp.Do(ctx, chromedp.Navigate(srv.URL)); err != nil {
		b.Close()
		t.Fatal(err)
	}
	browsertest.Until(t, ctx, `document.getElementById("x").textContent === "later"`, "the page's script to run")
	if got := browsertest.Eval[string](t, ctx, `document.title`); got != "hello" {
		t.Errorf("title %q", got)
	}
	b.Close()
	// Close waited for the process: it is gone (reaped), not a zombie.
	if err := syscall.Kill(pid, 0); err == nil {
		t.Errorf("browser pid %d still exists after Close", pid)
	}
}

// Tabs of the shared browser do not share storage: each test sees its own.
func TestSharedTabsAreIsolated(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		_, _ = w.Write([]byte(`<p>storage</p>`))
	}))
	defer srv.Close()
	a := browsertest.Tab(t, 20*time.Second)
	b := browsertest.Tab(t, 20*time.Second)
	if err := chromedp.Do(a, chromedp.Navigate(srv.URL)); err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(b, chromedp.Navigate(srv.URL)); err != nil {
		t.Fatal(err)
	}
	browsertest.Eval[chromedp.Void](t, a, `localStorage.setItem("k", "a")`)
	if got := browsertest.Eval[string](t, a, `localStorage.getItem("k") || ""`); got != "a" {
		t.Fatalf("tab a reads %q back", got)
	}
	if got := browsertest.Eval[string](t, b, `localStorage.getItem("k") || ""`); got != "" {
		t.Fatalf("tab b sees tab a's storage: %q", got)
	}
}
