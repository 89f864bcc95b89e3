// Package web owns the built-in chat page the api serves at GET / (unless
// CHAT_PAGE_ENABLED=false): one self-contained HTML file with its CSS and
// JavaScript inline, embedded in the binary, so a newcomer can chat with
// the gateway in a browser with nothing to build or install. The page
// talks only to /v1/stream and /v1/streams/{id} on its own origin; what it
// does is described in README.md ("For frontend developers").
//
// Its test hooks are a contract kept stable for browser tests and for
// anyone automating it: a form #chat-form with textarea#prompt and a
// submit button; each answer an element with data-role="assistant" whose
// data-state is "streaming", then "done" or "error", and whose text content
// is the answer alone.
package web

import (
	"bytes"
	"crypto/sha256"
	_ "embed"
	"encoding/base64"
	"fmt"
	"net/http"
	"strconv"
)

//go:embed chat.html
var chatHTML []byte

// contentSecurityPolicy allows exactly the page's own inline script and
// style (by hash) and requests to its own origin: a message that somehow
// reached the DOM as markup still could not run or load anything.
var contentSecurityPolicy = func() string {
	return fmt.Sprintf("default-src 'none'; script-src %s; style-src %s; connect-src 'self'; img-src data:; "+
		"base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
		inlineHash(chatHTML, "<script>", "</script>"), inlineHash(chatHTML, "<style>", "</style>"))
}()

// inlineHash is the CSP source of the first inline element between open
// and end in page.
func inlineHash(page []byte, open, end string) string {
	_, rest, ok := bytes.Cut(page, []byte(open))
	body, _, ok2 := bytes.Cut(rest, []byte(end))
	if !ok || !ok2 {
		// The page is embedded at build time; the test of this package
		// fails if it loses its inline script or style.
		return "'none'"
	}
	sum := sha256.Sum256(body)
	return "'sha256-" + base64.StdEncoding.EncodeToString(sum[:]) + "'"
}

// Handler serves the chat page.
func Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Type", "text/html; charset=utf-8")
		h.Set("Content-Length", strconv.Itoa(len(chatHTML)))
		// The page is small and changes with the binary: revalidating on
		// every load costs nothing and never serves an old page after an
		// upgrade.
		h.Set("Cache-Control", "no-cache")
		h.Set("Content-Security-Policy", contentSecurityPolicy)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		if r.Method == http.MethodHead {
			return
		}
		_, _ = w.Write(chatHTML)
	})
}
