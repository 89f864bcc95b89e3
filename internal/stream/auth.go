package stream

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"net"
	"net/http"
	"strings"

	"github.com/spillway-dev/spillway/internal/protocol"
)

// apiKeys are the sha256 digests of the accepted API keys.
type apiKeys [][sha256.Size]byte

// newAPIKeys digests keys; an entry that is already a sha256 hex digest is
// taken as one, so keys need not be stored in clear.
func newAPIKeys(keys []string) apiKeys {
	var out apiKeys
	for _, k := range keys {
		k = strings.TrimSpace(k)
		if k == "" {
			continue
		}
		var sum [sha256.Size]byte
		if b, err := hex.DecodeString(k); err == nil && len(b) == sha256.Size {
			copy(sum[:], b)
		} else {
			sum = sha256.Sum256([]byte(k))
		}
		out = append(out, sum)
	}
	return out
}

// identity is who the pool and the rate limit count a request against
// (docs/API.md, "Identity"): the API key's digest when keys are
// configured, else the X-User-ID header, else the client IP.
func (h *Handler) identity(r *http.Request) (string, *protocol.Problem) {
	if len(h.keys) > 0 {
		auth := r.Header.Get("Authorization")
		key, ok := strings.CutPrefix(auth, "Bearer ")
		if !ok || key == "" {
			return "", protocol.Unauthorized("Send Authorization: Bearer <key>.")
		}
		sum := sha256.Sum256([]byte(key))
		// Compare with every key in constant time, so the time taken does
		// not tell how close a guess came.
		match := 0
		for i := range h.keys {
			match |= subtle.ConstantTimeCompare(sum[:], h.keys[i][:])
		}
		if match == 0 {
			return "", protocol.Unauthorized("The API key is not valid.")
		}
		return "key:" + hex.EncodeToString(sum[:6]), nil
	}
	if uid, ok := r.Header["X-User-Id"]; ok {
		if len(uid) != 1 || !protocol.ValidUserID(uid[0]) {
			return "", protocol.BadRequest("X-User-ID must be 1 to 128 characters of A-Z a-z 0-9 . _ : @ -")
		}
		return uid[0], nil
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	return "ip:" + host, nil
}
