package cors_test

import (
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/gin-gonic/gin"

	"github.com/spillway-dev/spillway/internal/web/cors"
)

const (
	allowed = "https://chat.example.com"
	other   = "https://evil.example"
)

// answer runs one request through h and returns the recorded response.
func answer(h http.Handler, method, origin string, hdr map[string]string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, "/v1/stream", nil)
	if origin != "" {
		r.Header.Set("Origin", origin)
	}
	for k, v := range hdr {
		r.Header.Set(k, v)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// withPolicy installs p as the api does: first gin middleware, before a
// route that stands for every api route.
func withPolicy(p *cors.Policy, next http.Handler) http.Handler {
	e := gin.New()
	e.Use(p.Gin())
	e.Any("/*path", gin.WrapH(next))
	return e
}

// refusing stands for an api route: it answers a 429 with Retry-After.
var refusing = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Retry-After", "3")
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(http.StatusTooManyRequests)
})

var preflightHdr = map[string]string{
	"Access-Control-Request-Method":  "POST",
	"Access-Control-Request-Headers": "content-type,authorization,x-user-id",
}

func TestPolicy(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		origins    []string
		method     string
		origin     string
		hdr        map[string]string
		wantStatus int
		wantAllow  string // Access-Control-Allow-Origin; "" means absent
		preflight  bool   // wants the preflight headers
		wantVary   bool
	}{
		{"listed origin, preflight", []string{allowed}, http.MethodOptions, allowed, preflightHdr, http.StatusNoContent, allowed, true, true},
		{"listed origin in another case", []string{"HTTPS://Chat.Example.com"}, http.MethodOptions, allowed, preflightHdr, http.StatusNoContent, allowed, true, true},
		{"listed origin, refusal keeps its status", []string{allowed}, http.MethodPost, allowed, nil, http.StatusTooManyRequests, allowed, false, true},
		{"other origin, preflight has no permission", []string{allowed}, http.MethodOptions, other, preflightHdr, http.StatusNoContent, "", false, true},
		{"other origin, request has no permission", []string{allowed}, http.MethodPost, other, nil, http.StatusTooManyRequests, "", false, true},
		{"star allows any origin", []string{cors.AnyOrigin}, http.MethodOptions, other, preflightHdr, http.StatusNoContent, "*", true, true},
		{"star, plain request", []string{cors.AnyOrigin}, http.MethodPost, other, nil, http.StatusTooManyRequests, "*", false, true},
		{"no Origin: not a CORS request", []string{cors.AnyOrigin}, http.MethodPost, "", nil, http.StatusTooManyRequests, "", false, true},
		{"OPTIONS without request method is no preflight", []string{allowed}, http.MethodOptions, allowed, nil, http.StatusTooManyRequests, allowed, false, true},
		{"disabled policy adds nothing", nil, http.MethodOptions, allowed, preflightHdr, http.StatusTooManyRequests, "", false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := cors.New(cors.Config{AllowedOrigins: tt.origins})
			w := answer(withPolicy(p, refusing), tt.method, tt.origin, tt.hdr)
			h := w.Header()
			if w.Code != tt.wantStatus {
				t.Errorf("status %d, want %d", w.Code, tt.wantStatus)
			}
			if got := h.Get("Access-Control-Allow-Origin"); got != tt.wantAllow {
				t.Errorf("Access-Control-Allow-Origin %q, want %q", got, tt.wantAllow)
			}
			if got := slices.Contains(h.Values("Vary"), "Origin"); got != tt.wantVary {
				t.Errorf("Vary %q, want Origin in it: %v", h.Values("Vary"), tt.wantVary)
			}
			methods, headers, age := h.Get("Access-Control-Allow-Methods"), h.Get("Access-Control-Allow-Headers"), h.Get("Access-Control-Max-Age")
			if tt.preflight {
				for _, m := range []string{"GET", "POST", "DELETE"} {
					if !strings.Contains(methods, m) {
						t.Errorf("Allow-Methods %q lacks %s", methods, m)
					}
				}
				for _, name := range []string{"Content-Type", "Authorization", "X-User-ID", "X-Session-ID", "X-Priority", "Last-Event-ID"} {
					if !strings.Contains(headers, name) {
						t.Errorf("Allow-Headers %q lacks %s", headers, name)
					}
				}
				if age != "600" {
					t.Errorf("Max-Age %q, want 600", age)
				}
			} else if methods != "" || headers != "" || age != "" {
				t.Errorf("preflight headers on a non-preflight answer: %q %q %q", methods, headers, age)
			}
			expose := h.Get("Access-Control-Expose-Headers")
			if tt.wantAllow != "" && !tt.preflight {
				if expose != "X-Request-ID, X-Stream-Path, Retry-After" {
					t.Errorf("Expose-Headers %q", expose)
				}
			} else if expose != "" {
				t.Errorf("Expose-Headers %q on an answer that grants nothing to read", expose)
			}
			if h.Get("Retry-After") == "" && w.Code == http.StatusTooManyRequests {
				t.Errorf("the route's own headers were lost")
			}
		})
	}
}

// As gin middleware installed first, the policy covers the 404 and 405
// handlers and a panicking route answered by a recovery installed after it.
func TestGinCoversRefusalsAndPanics(t *testing.T) {
	t.Parallel()
	gin.SetMode(gin.ReleaseMode)
	e := gin.New()
	e.HandleMethodNotAllowed = true
	e.Use(cors.New(cors.Config{AllowedOrigins: []string{allowed}}).Gin())
	e.Use(gin.CustomRecovery(func(c *gin.Context, _ any) {
		c.AbortWithStatus(http.StatusInternalServerError)
	}))
	e.POST("/v1/stream", func(*gin.Context) { panic("bug") })
	e.GET("/healthz", func(c *gin.Context) { c.Status(http.StatusOK) })
	e.NoRoute(func(c *gin.Context) { c.Status(http.StatusNotFound) })
	e.NoMethod(func(c *gin.Context) { c.Status(http.StatusMethodNotAllowed) })

	for _, tt := range []struct {
		method, path string
		hdr          map[string]string
		want         int
	}{
		{http.MethodOptions, "/v1/stream", preflightHdr, http.StatusNoContent},
		{http.MethodOptions, "/no/such/route", preflightHdr, http.StatusNoContent},
		{http.MethodPost, "/v1/stream", nil, http.StatusInternalServerError},
		{http.MethodGet, "/no/such/route", nil, http.StatusNotFound},
		{http.MethodPut, "/v1/stream", nil, http.StatusMethodNotAllowed},
		{http.MethodGet, "/healthz", nil, http.StatusOK},
	} {
		r := httptest.NewRequest(tt.method, tt.path, nil)
		r.Header.Set("Origin", allowed)
		for k, v := range tt.hdr {
			r.Header.Set(k, v)
		}
		w := httptest.NewRecorder()
		e.ServeHTTP(w, r)
		if w.Code != tt.want || w.Header().Get("Access-Control-Allow-Origin") != allowed {
			t.Errorf("%s %s: status %d (want %d), Allow-Origin %q", tt.method, tt.path, w.Code, tt.want,
				w.Header().Get("Access-Control-Allow-Origin"))
		}
	}
}
