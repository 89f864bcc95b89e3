// Package identity owns who a request counts against (docs/API.md,
// "Identity"): API key entries and their digests, the three identity
// namespaces (key, user, ip) that never overlap, and the client address
// behind trusted proxies.
package identity

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"strings"

	"github.com/spillway-dev/spillway/internal/protocol"
)

// Priority is an API key's priority maximum, written after its entry as
// `=high`, `=normal` or `=low` (docs/OPERATIONS.md, API_KEYS).
type Priority string

// Priorities a key entry may carry. PriorityUnset means the entry named
// none: the caller's maximum is PRIORITY_MAX.
const (
	PriorityUnset  Priority = ""
	PriorityHigh   Priority = "high"
	PriorityNormal Priority = "normal"
	PriorityLow    Priority = "low"
)

// Namespace prefixes. A user id may contain ':' but never '/', and every
// identity starts with exactly one of these, so no value a client sends
// can name another namespace's bucket.
const (
	prefixKey  = "key:"
	prefixUser = "user:"
	prefixIP   = "ip:"
	// keyDigestPrefix is how many hex digits of a key's digest name it:
	// enough to tell keys apart, too few to help guess one.
	keyDigestPrefix = 12
)

// digestMarker starts an API_KEYS entry that is a digest, not a key.
const digestMarker = "sha256:"

// Errors of ParseKey, matched with errors.Is.
var (
	// ErrBadDigest is an entry starting with sha256: not followed by 64
	// hex digits.
	ErrBadDigest = errors.New("a digest must be written sha256:<64 hex digits>")
	// ErrEmptyKey is an entry with nothing before its priority.
	ErrEmptyKey = errors.New("the key is empty")
)

// Key is one accepted API key: the sha256 digest of the key and its
// priority maximum.
type Key struct {
	Digest   [sha256.Size]byte
	Priority Priority
}

// ParseKey reads one API_KEYS entry: a key, or `sha256:<64 hex>` (the
// digest of one, so keys need not be stored in clear), either optionally
// followed by `=high`, `=normal` or `=low`. A bare 64-hex string is a key
// like any other. Only those three words after the last '=' are a
// priority, so a base64 key ending in '=' stays whole.
func ParseKey(entry string) (Key, error) {
	var k Key
	entry = strings.TrimSpace(entry)
	if i := strings.LastIndexByte(entry, '='); i >= 0 {
		switch p := Priority(entry[i+1:]); p {
		case PriorityHigh, PriorityNormal, PriorityLow:
			k.Priority, entry = p, entry[:i]
		}
	}
	if entry == "" {
		return Key{}, ErrEmptyKey
	}
	if hexDigest, ok := strings.CutPrefix(entry, digestMarker); ok {
		b, err := hex.DecodeString(hexDigest)
		if err != nil || len(b) != sha256.Size {
			return Key{}, ErrBadDigest
		}
		copy(k.Digest[:], b)
		return k, nil
	}
	k.Digest = sha256.Sum256([]byte(entry))
	return k, nil
}

// ParseKeys reads every API_KEYS entry, skipping empty ones. The error
// names the entry by position only: an entry may be a secret.
func ParseKeys(entries []string) ([]Key, error) {
	var out []Key
	var errs []error
	for i, e := range entries {
		if strings.TrimSpace(e) == "" {
			continue
		}
		k, err := ParseKey(e)
		if err != nil {
			errs = append(errs, fmt.Errorf("entry %d: %w", i+1, err))
			continue
		}
		out = append(out, k)
	}
	return out, errors.Join(errs...)
}

// ParseProxies reads TRUSTED_PROXIES: CIDRs, or single addresses.
func ParseProxies(items []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	var errs []error
	for _, s := range items {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		if p, err := netip.ParsePrefix(s); err == nil {
			out = append(out, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(s)
		if err != nil {
			errs = append(errs, fmt.Errorf("%q is not a CIDR (e.g. 10.0.0.0/8) or an address", s))
			continue
		}
		a = a.Unmap()
		out = append(out, netip.PrefixFrom(a, a.BitLen()))
	}
	return out, errors.Join(errs...)
}

// Config is how identities are found.
type Config struct {
	// Keys are the accepted API keys; none means no authentication.
	Keys []Key
	// TrustUserIDHeader lets X-User-ID name the caller (under a key:
	// scoped to it). Default in the settings: true (TRUST_USER_ID_HEADER).
	TrustUserIDHeader bool
	// TrustedProxies are the peers whose X-Forwarded-For and X-Real-IP
	// are believed (TRUSTED_PROXIES). Empty: the peer is the client.
	TrustedProxies []netip.Prefix
}

// Identity is who a request counts against.
type Identity struct {
	// Name is who the request is: `key:<digest>`, `key:<digest>/user:<id>`,
	// `user:<id>` or `ip:<addr>`. Bucket(Name) is what the limits count.
	Name string
	// MaxPriority is the key's priority maximum; unset without a key or
	// when the key named none.
	MaxPriority Priority
}

// Bucket is the identity the limits count name against (the rate limit,
// the pool's per-user slots, the queue cap): a key's users count against
// their key together, so varying X-User-ID never widens a key's limits
// (docs/API.md, "Identity"); any other identity counts against itself.
// The full name still tells a key's users apart where they share fairly
// (the workers' and upstreams' round-robin) and owns their streams.
func Bucket(name string) string {
	if k, _, scoped := strings.Cut(name, "/"+prefixUser); scoped && strings.HasPrefix(k, prefixKey) {
		return k
	}
	return name
}

// Resolver finds the identity of requests. Safe for concurrent use.
type Resolver struct{ cfg Config }

// NewResolver returns a resolver for cfg.
func NewResolver(cfg Config) *Resolver { return &Resolver{cfg: cfg} }

// Authenticating reports whether API keys are required.
func (r *Resolver) Authenticating() bool { return len(r.cfg.Keys) > 0 }

// Resolve returns the caller's identity, or the problem to refuse the
// request with (a missing or wrong key, a malformed X-User-ID).
func (r *Resolver) Resolve(req *http.Request) (Identity, *protocol.Problem) {
	var id Identity
	if len(r.cfg.Keys) > 0 {
		k, p := r.key(req.Header.Get("Authorization"))
		if p != nil {
			return Identity{}, p
		}
		id = Identity{Name: prefixKey + hex.EncodeToString(k.Digest[:])[:keyDigestPrefix], MaxPriority: k.Priority}
	}
	if r.cfg.TrustUserIDHeader {
		if uid, ok := req.Header["X-User-Id"]; ok {
			if len(uid) != 1 || !protocol.ValidUserID(uid[0]) {
				return Identity{}, protocol.BadRequest("X-User-ID must be 1 to 128 characters of A-Z a-z 0-9 . _ : @ -")
			}
			if id.Name != "" {
				// Scoped to the key: one frontend key serving many users
				// is many identities, and no key can name another's user.
				id.Name += "/" + prefixUser + uid[0]
			} else {
				id.Name = prefixUser + uid[0]
			}
			return id, nil
		}
	}
	if id.Name != "" {
		return id, nil
	}
	return Identity{Name: prefixIP + r.ClientAddr(req).String()}, nil
}

// Authenticate checks only the request's API key: nil when it carries a
// configured one, or when none is configured; else the 401 problem. What
// is not a stream (GET /metrics under METRICS_AUTH=api-key) asks this,
// with no identity to find.
func (r *Resolver) Authenticate(req *http.Request) *protocol.Problem {
	if len(r.cfg.Keys) == 0 {
		return nil
	}
	_, p := r.key(req.Header.Get("Authorization"))
	return p
}

// key finds the configured key the Authorization header carries.
func (r *Resolver) key(auth string) (Key, *protocol.Problem) {
	scheme, token, ok := strings.Cut(auth, " ")
	// RFC 9110 §11.1: the scheme is case-insensitive.
	if !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(token) == "" {
		return Key{}, protocol.Unauthorized("Send Authorization: Bearer <key>.")
	}
	sum := sha256.Sum256([]byte(strings.TrimSpace(token)))
	// Compare with every key in constant time, so the time taken does not
	// tell how close a guess came.
	found := -1
	for i := range r.cfg.Keys {
		if subtle.ConstantTimeCompare(sum[:], r.cfg.Keys[i].Digest[:]) == 1 {
			found = i
		}
	}
	if found < 0 {
		return Key{}, protocol.Unauthorized("The API key is not valid.")
	}
	return r.cfg.Keys[found], nil
}

// ClientAddr is the client's address: the peer's, unless the peer is a
// trusted proxy; then the right-most X-Forwarded-For hop that is not a
// trusted proxy (the left part of the header is whatever the client
// wrote), else X-Real-IP, else the peer.
func (r *Resolver) ClientAddr(req *http.Request) netip.Addr {
	peer := peerAddr(req.RemoteAddr)
	if !peer.IsValid() || !r.trusted(peer) {
		return peer
	}
	if xff := req.Header.Values("X-Forwarded-For"); len(xff) > 0 {
		hops := strings.Split(strings.Join(xff, ","), ",")
		for i := len(hops) - 1; i >= 0; i-- {
			a, ok := parseHop(hops[i])
			if !ok {
				// A hop no proxy of ours wrote: nothing left of it is
				// believable either.
				break
			}
			if !r.trusted(a) {
				return a
			}
			peer = a
		}
		return peer
	}
	if a, ok := parseHop(req.Header.Get("X-Real-IP")); ok {
		return a
	}
	return peer
}

func (r *Resolver) trusted(a netip.Addr) bool {
	for _, p := range r.cfg.TrustedProxies {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// peerAddr is the address of RemoteAddr; the zero Addr when it has none
// (a test's or a unix socket's), which names one bucket "ip:invalid IP".
func peerAddr(remote string) netip.Addr {
	if ap, err := netip.ParseAddrPort(remote); err == nil {
		return ap.Addr().Unmap()
	}
	a, _ := netip.ParseAddr(remote)
	return a.Unmap()
}

// parseHop reads one X-Forwarded-For or X-Real-IP value: an address,
// with or without a port.
func parseHop(s string) (netip.Addr, bool) {
	s = strings.TrimSpace(s)
	if a, err := netip.ParseAddr(s); err == nil {
		return a.Unmap(), true
	}
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().Unmap(), true
	}
	return netip.Addr{}, false
}
