// Package cors owns the api's Cross-Origin Resource Sharing policy: which
// browser origins may call it, the preflight answer, and the response
// headers a page on another origin may read (README.md, "For frontend
// developers").
//
// It lives under internal/web, beside the chat page, because both exist
// for browsers; it is a middleware of its own because it must wrap every
// route, refusals included: a page can only read a 429's Retry-After when
// the 429 carries the CORS headers too.
package cors

import (
	"net/http"
	"strconv"
	"strings"

	"github.com/gin-gonic/gin"
)

// AnyOrigin is the Config.AllowedOrigins item that allows every origin.
const AnyOrigin = "*"

// The lists a preflight answer and every allowed response carry. They are
// the request headers the api reads and the response headers a client
// needs (the stream id to resume or stop, the path, the advised delay).
var (
	allowMethods  = strings.Join([]string{http.MethodGet, http.MethodPost, http.MethodDelete, http.MethodOptions}, ", ")
	allowHeaders  = strings.Join([]string{"Content-Type", "Authorization", "X-User-ID", "X-Session-ID", "X-Priority", "Last-Event-ID"}, ", ")
	exposeHeaders = strings.Join([]string{"X-Request-ID", "X-Stream-Path", "Retry-After"}, ", ")
)

// maxAge is how long a browser may cache a preflight answer, in seconds.
// Chromium caps it at 7200; ten minutes keeps a changed policy from
// lingering long in open tabs.
const maxAge = 600

// Config is the policy.
type Config struct {
	// AllowedOrigins are the origins (scheme://host[:port], compared without
	// regard to case) allowed to call the api, or the one item "*" for
	// every origin (CORS_ALLOWED_ORIGINS). Empty means no CORS headers at
	// all, so browsers keep the same-origin rule. Default empty.
	AllowedOrigins []string
}

// Policy answers preflights and adds CORS headers. Its methods are safe
// for concurrent use; it never changes after New.
type Policy struct {
	any     bool
	allowed map[string]bool
}

// New builds the policy of cfg. The items are expected to be checked
// already (internal/config does); an item that is not an origin simply
// never matches a browser's Origin header.
func New(cfg Config) *Policy {
	p := &Policy{allowed: make(map[string]bool, len(cfg.AllowedOrigins))}
	for _, o := range cfg.AllowedOrigins {
		if o = strings.TrimSpace(o); o == AnyOrigin {
			p.any = true
		} else if o != "" {
			p.allowed[strings.ToLower(o)] = true
		}
	}
	return p
}

// Enabled reports whether the policy allows any origin at all; a disabled
// policy adds nothing and need not be installed.
func (p *Policy) Enabled() bool { return p.any || len(p.allowed) > 0 }

// Apply adds the CORS headers r calls for to w. It reports true when r was
// a preflight and has been answered (204); the caller then writes nothing
// more. A request without Origin, or from an origin not allowed, gets no
// Access-Control-Allow-Origin, so the browser keeps the answer from the
// page; a preflight from such an origin is still answered 204, with no
// permission in it, rather than with a 405 problem.
func (p *Policy) Apply(w http.ResponseWriter, r *http.Request) bool {
	if !p.Enabled() {
		return false
	}
	h := w.Header()
	// The answer depends on Origin: caches must not serve one origin's
	// permission to another.
	h.Add("Vary", "Origin")
	origin := r.Header.Get("Origin")
	preflight := r.Method == http.MethodOptions && origin != "" && r.Header.Get("Access-Control-Request-Method") != ""
	if preflight {
		h.Add("Vary", "Access-Control-Request-Method")
		h.Add("Vary", "Access-Control-Request-Headers")
	}
	if origin != "" && p.allows(origin) {
		if p.any {
			h.Set("Access-Control-Allow-Origin", AnyOrigin)
		} else {
			h.Set("Access-Control-Allow-Origin", origin)
		}
		if preflight {
			h.Set("Access-Control-Allow-Methods", allowMethods)
			h.Set("Access-Control-Allow-Headers", allowHeaders)
			h.Set("Access-Control-Max-Age", strconv.Itoa(maxAge))
		} else {
			h.Set("Access-Control-Expose-Headers", exposeHeaders)
		}
	}
	if preflight {
		w.WriteHeader(http.StatusNoContent)
	}
	return preflight
}

func (p *Policy) allows(origin string) bool {
	return p.any || p.allowed[strings.ToLower(origin)]
}

// Gin is the policy as gin middleware. Installed first with Engine.Use, it
// runs before the panic recovery and for the 404 and 405 handlers too
// (gin adds global middleware to those), so every refusal carries the
// headers.
func (p *Policy) Gin() gin.HandlerFunc {
	return func(c *gin.Context) {
		if p.Apply(c.Writer, c.Request) {
			c.Writer.WriteHeaderNow() // gin otherwise defers the status
			c.Abort()
			return
		}
		c.Next()
	}
}
