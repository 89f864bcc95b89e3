// Package redact owns how a value that may carry a secret is printed: a
// URL's password (user:password@, as in LLM_BASE_URL or REDIS_URL) never
// reaches an error, a log line or a metric label; a KAFKA_BROKERS item's
// user part neither.
package redact

import (
	"net/url"
	"regexp"
	"strings"
)

// URL returns raw with its password replaced by "xxxxx", as
// url.URL.Redacted does (a user part without a password is replaced too:
// it may be a token). A string url.Parse refuses, or reads as opaque
// (`user:pass@host` without a scheme), has everything between "//" (or
// the start) and the last "@" before the path replaced instead, so a
// malformed URL, the one most likely to be printed in an error, is
// redacted too. Text without credentials comes back unchanged.
func URL(raw string) string {
	if u, err := url.Parse(raw); err == nil && u.Opaque == "" {
		if u.User == nil {
			return raw
		}
		if _, has := u.User.Password(); !has {
			// A lone user part may be a token (https://token@host).
			u.User = url.User("xxxxx")
		}
		return u.Redacted()
	}
	start := strings.Index(raw, "//")
	if start < 0 {
		start = 0
	} else {
		start += 2
	}
	rest := raw[start:]
	end := len(rest)
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		end = i
	}
	at := strings.LastIndex(rest[:end], "@")
	if at < 0 {
		return raw
	}
	return raw[:start] + "xxxxx" + rest[at:]
}

// URLs returns each of raw through URL: for a list setting such as
// KAFKA_BROKERS, whose items may carry a user part.
func URLs(raw []string) []string {
	out := make([]string, len(raw))
	for i, r := range raw {
		out[i] = URL(r)
	}
	return out
}

// userinfo is the user part of a URL inside free text: a scheme, "//",
// then anything up to an "@" that is not a space or a path.
var userinfo = regexp.MustCompile(`([A-Za-z][A-Za-z0-9+.-]*://)[^\s/@]+@`)

// Text returns s with the user part of every URL in it replaced by
// "xxxxx": for messages of other code that may quote a URL (an exporter's
// error naming its endpoint, OTEL_EXPORTER_OTLP_ENDPOINT).
func Text(s string) string {
	return userinfo.ReplaceAllString(s, "${1}xxxxx@")
}
