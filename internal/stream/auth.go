package stream

import (
	"net/http"

	"github.com/spillway-dev/spillway/internal/identity"
	"github.com/spillway-dev/spillway/internal/protocol"
)

// identity is who the pool, the rate limit and the queue caps count a
// request against (docs/API.md, "Identity"): the API key, the X-User-ID
// (under a key: scoped to it) or the client address, in namespaces that
// never overlap. identity.Resolver holds the rules.
func (h *Handler) identity(r *http.Request) (identity.Identity, *protocol.Problem) {
	return h.ids.Resolve(r)
}

// newResolver parses the identity settings of cfg; Validate reports the
// same errors.
func newResolver(cfg Config) (*identity.Resolver, error) {
	keys, err := identity.ParseKeys(cfg.APIKeys)
	if err != nil {
		return nil, err
	}
	proxies, err := identity.ParseProxies(cfg.TrustedProxies)
	if err != nil {
		return nil, err
	}
	return identity.NewResolver(identity.Config{
		Keys: keys, TrustUserIDHeader: !cfg.IgnoreUserIDHeader, TrustedProxies: proxies,
	}), nil
}
