package identity

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func digestOf(key string) string {
	s := sha256.Sum256([]byte(key))
	return hex.EncodeToString(s[:])
}

func keyName(key string) string { return "key:" + digestOf(key)[:keyDigestPrefix] }

func TestParseKey(t *testing.T) {
	t.Parallel()
	hex64 := digestOf("frontend")
	tests := []struct {
		entry    string
		digestOf string // the key whose digest is expected
		prio     Priority
		err      error
	}{
		{entry: "secret", digestOf: "secret"},
		{entry: " secret ", digestOf: "secret"},
		{entry: "secret=high", digestOf: "secret", prio: PriorityHigh},
		{entry: "secret=low", digestOf: "secret", prio: PriorityLow},
		{entry: "secret=normal", digestOf: "secret", prio: PriorityNormal},
		// base64 padding and unknown words stay part of the key
		{entry: "c2VjcmV0==", digestOf: "c2VjcmV0=="},
		{entry: "a=b", digestOf: "a=b"},
		{entry: "secret=HIGH", digestOf: "secret=HIGH"},
		// a bare 64-hex key is a key, not a digest
		{entry: hex64, digestOf: hex64},
		{entry: "sha256:" + hex64, digestOf: "frontend"},
		{entry: "sha256:" + hex64 + "=low", digestOf: "frontend", prio: PriorityLow},
		{entry: "sha256:" + strings.ToUpper(hex64), digestOf: "frontend"},
		{entry: "sha256:abc", err: ErrBadDigest},
		{entry: "sha256:" + hex64[:63] + "z", err: ErrBadDigest},
		{entry: "=high", err: ErrEmptyKey},
	}
	for _, tc := range tests {
		t.Run(tc.entry, func(t *testing.T) {
			t.Parallel()
			k, err := ParseKey(tc.entry)
			if !errors.Is(err, tc.err) {
				t.Fatalf("ParseKey(%q) err = %v, want %v", tc.entry, err, tc.err)
			}
			if tc.err != nil {
				return
			}
			if got := hex.EncodeToString(k.Digest[:]); got != digestOf(tc.digestOf) {
				t.Errorf("digest = %s, want digest of %q", got, tc.digestOf)
			}
			if k.Priority != tc.prio {
				t.Errorf("priority = %q, want %q", k.Priority, tc.prio)
			}
		})
	}
}

func TestParseKeysNamesNoSecret(t *testing.T) {
	t.Parallel()
	keys, err := ParseKeys([]string{"a", "", "sha256:topsecret"})
	if err == nil || !errors.Is(err, ErrBadDigest) || strings.Contains(err.Error(), "topsecret") || !strings.Contains(err.Error(), "entry 3") {
		t.Fatalf("err = %v, want entry 3 named without its text", err)
	}
	if len(keys) != 1 {
		t.Errorf("got %d keys, want 1", len(keys))
	}
}

func TestParseProxies(t *testing.T) {
	t.Parallel()
	got, err := ParseProxies([]string{"10.0.0.0/8", " 192.168.1.7 ", "::1", "fd00::/8", ""})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"10.0.0.0/8", "192.168.1.7/32", "::1/128", "fd00::/8"}
	if len(got) != len(want) {
		t.Fatalf("got %v", got)
	}
	for i := range want {
		if got[i].String() != want[i] {
			t.Errorf("[%d] = %s, want %s", i, got[i], want[i])
		}
	}
	if _, err := ParseProxies([]string{"10.0.0.0/33", "proxy.local"}); err == nil || !strings.Contains(err.Error(), "proxy.local") {
		t.Errorf("err = %v, want both named", err)
	}
}

// TestResolve is the identity rules table (docs/API.md, "Identity").
func TestResolve(t *testing.T) {
	t.Parallel()
	mustKeys := func(entries ...string) []Key {
		k, err := ParseKeys(entries)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	proxies, err := ParseProxies([]string{"10.0.0.0/8"})
	if err != nil {
		t.Fatal(err)
	}
	keys := mustKeys("front=high", "back", "sha256:"+digestOf("hashed")+"=low")
	hex64 := digestOf("x")
	type hdr = map[string][]string
	tests := []struct {
		name    string
		cfg     Config
		remote  string
		headers hdr
		want    Identity
		status  int // a refusal
	}{
		{name: "anonymous by peer", cfg: Config{TrustUserIDHeader: true}, remote: "192.0.2.1:5000", want: Identity{Name: "ip:192.0.2.1"}},
		{name: "ipv6 peer", cfg: Config{TrustUserIDHeader: true}, remote: "[2001:db8::1]:5000", want: Identity{Name: "ip:2001:db8::1"}},
		{name: "mapped v4 peer", cfg: Config{}, remote: "[::ffff:192.0.2.1]:5000", want: Identity{Name: "ip:192.0.2.1"}},
		{name: "user header", cfg: Config{TrustUserIDHeader: true}, remote: "192.0.2.1:5000", headers: hdr{"X-User-Id": {"alice"}}, want: Identity{Name: "user:alice"}},
		{name: "user header naming an ip stays a user", cfg: Config{TrustUserIDHeader: true}, remote: "127.0.0.1:5000", headers: hdr{"X-User-Id": {"ip:127.0.0.1"}}, want: Identity{Name: "user:ip:127.0.0.1"}},
		{name: "user header naming a key stays a user", cfg: Config{TrustUserIDHeader: true}, remote: "127.0.0.1:5000", headers: hdr{"X-User-Id": {keyName("front")}}, want: Identity{Name: "user:" + keyName("front")}},
		{name: "user header ignored when untrusted", cfg: Config{}, remote: "192.0.2.1:5000", headers: hdr{"X-User-Id": {"alice"}}, want: Identity{Name: "ip:192.0.2.1"}},
		{name: "bad user header", cfg: Config{TrustUserIDHeader: true}, remote: "192.0.2.1:5000", headers: hdr{"X-User-Id": {"a b"}}, status: 400},
		{name: "two user headers", cfg: Config{TrustUserIDHeader: true}, remote: "192.0.2.1:5000", headers: hdr{"X-User-Id": {"a", "b"}}, status: 400},
		{name: "xff from untrusted peer ignored", cfg: Config{TrustedProxies: proxies}, remote: "192.0.2.1:5000", headers: hdr{"X-Forwarded-For": {"198.51.100.9"}}, want: Identity{Name: "ip:192.0.2.1"}},
		{name: "x-real-ip from untrusted peer ignored", cfg: Config{TrustedProxies: proxies}, remote: "192.0.2.1:5000", headers: hdr{"X-Real-Ip": {"198.51.100.9"}}, want: Identity{Name: "ip:192.0.2.1"}},
		{name: "xff from trusted proxy", cfg: Config{TrustedProxies: proxies}, remote: "10.0.0.2:5000", headers: hdr{"X-Forwarded-For": {"198.51.100.9"}}, want: Identity{Name: "ip:198.51.100.9"}},
		{name: "xff right-most untrusted hop", cfg: Config{TrustedProxies: proxies}, remote: "10.0.0.2:5000", headers: hdr{"X-Forwarded-For": {"6.6.6.6, 198.51.100.9, 10.1.1.1"}}, want: Identity{Name: "ip:198.51.100.9"}},
		{name: "xff over several headers", cfg: Config{TrustedProxies: proxies}, remote: "10.0.0.2:5000", headers: hdr{"X-Forwarded-For": {"6.6.6.6", "198.51.100.9"}}, want: Identity{Name: "ip:198.51.100.9"}},
		{name: "xff garbage stops at last trusted hop", cfg: Config{TrustedProxies: proxies}, remote: "10.0.0.2:5000", headers: hdr{"X-Forwarded-For": {"evil, 10.1.1.1"}}, want: Identity{Name: "ip:10.1.1.1"}},
		{name: "x-real-ip from trusted proxy", cfg: Config{TrustedProxies: proxies}, remote: "10.0.0.2:5000", headers: hdr{"X-Real-Ip": {"198.51.100.9"}}, want: Identity{Name: "ip:198.51.100.9"}},
		{name: "trusted proxy without headers", cfg: Config{TrustedProxies: proxies}, remote: "10.0.0.2:5000", want: Identity{Name: "ip:10.0.0.2"}},
		{name: "key", cfg: Config{Keys: keys, TrustUserIDHeader: true}, remote: "192.0.2.1:5000", headers: hdr{"Authorization": {"Bearer back"}}, want: Identity{Name: keyName("back")}},
		{name: "key with priority", cfg: Config{Keys: keys}, remote: "192.0.2.1:5000", headers: hdr{"Authorization": {"Bearer front"}}, want: Identity{Name: keyName("front"), MaxPriority: PriorityHigh}},
		{name: "digest entry", cfg: Config{Keys: keys}, remote: "192.0.2.1:5000", headers: hdr{"Authorization": {"Bearer hashed"}}, want: Identity{Name: keyName("hashed"), MaxPriority: PriorityLow}},
		{name: "bearer any case", cfg: Config{Keys: keys}, remote: "192.0.2.1:5000", headers: hdr{"Authorization": {"bEaReR back"}}, want: Identity{Name: keyName("back")}},
		{name: "user under key", cfg: Config{Keys: keys, TrustUserIDHeader: true}, remote: "192.0.2.1:5000", headers: hdr{"Authorization": {"Bearer front"}, "X-User-Id": {"alice"}}, want: Identity{Name: keyName("front") + "/user:alice", MaxPriority: PriorityHigh}},
		{name: "same user other key", cfg: Config{Keys: keys, TrustUserIDHeader: true}, remote: "192.0.2.1:5000", headers: hdr{"Authorization": {"Bearer back"}, "X-User-Id": {"alice"}}, want: Identity{Name: keyName("back") + "/user:alice"}},
		{name: "user under key ignored when untrusted", cfg: Config{Keys: keys}, remote: "192.0.2.1:5000", headers: hdr{"Authorization": {"Bearer front"}, "X-User-Id": {"alice"}}, want: Identity{Name: keyName("front"), MaxPriority: PriorityHigh}},
		{name: "missing key", cfg: Config{Keys: keys}, remote: "192.0.2.1:5000", status: 401},
		{name: "wrong key", cfg: Config{Keys: keys}, remote: "192.0.2.1:5000", headers: hdr{"Authorization": {"Bearer nope"}}, status: 401},
		{name: "basic scheme", cfg: Config{Keys: keys}, remote: "192.0.2.1:5000", headers: hdr{"Authorization": {"Basic back"}}, status: 401},
		{name: "digest is not a key", cfg: Config{Keys: keys}, remote: "192.0.2.1:5000", headers: hdr{"Authorization": {"Bearer " + digestOf("back")}}, status: 401},
		{name: "64-hex key works", cfg: Config{Keys: mustKeys(hex64)}, remote: "192.0.2.1:5000", headers: hdr{"Authorization": {"Bearer " + hex64}}, want: Identity{Name: keyName(hex64)}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			req := httptest.NewRequest(http.MethodPost, "/v1/stream", nil)
			req.RemoteAddr = tc.remote
			for k, v := range tc.headers {
				req.Header[k] = v
			}
			got, p := NewResolver(tc.cfg).Resolve(req)
			if tc.status != 0 {
				if p == nil || p.Status != tc.status {
					t.Fatalf("got %+v, %+v; want a %d problem", got, p, tc.status)
				}
				return
			}
			if p != nil {
				t.Fatalf("problem %+v", p)
			}
			if got != tc.want {
				t.Errorf("identity = %+v, want %+v", got, tc.want)
			}
		})
	}
}

// TestNamespacesNeverOverlap: no X-User-ID value, under any key or none,
// yields a name another namespace yields.
func TestNamespacesNeverOverlap(t *testing.T) {
	t.Parallel()
	keys, _ := ParseKeys([]string{"k"})
	ipName := NewResolver(Config{}).ClientAddr
	req := httptest.NewRequest(http.MethodPost, "/", nil)
	req.RemoteAddr = "127.0.0.1:1"
	ip := "ip:" + ipName(req).String()
	for _, uid := range []string{"ip:127.0.0.1", "127.0.0.1", keyName("k"), "key:" + digestOf("k")[:12], "user:x"} {
		for _, cfg := range []Config{{TrustUserIDHeader: true}, {Keys: keys, TrustUserIDHeader: true}} {
			r := req.Clone(req.Context())
			r.Header.Set("X-User-ID", uid)
			r.Header.Set("Authorization", "Bearer k")
			id, p := NewResolver(cfg).Resolve(r)
			if p != nil {
				t.Fatal(p)
			}
			want := "user:" + uid
			if len(cfg.Keys) > 0 {
				want = keyName("k") + "/user:" + uid
			}
			if id.Name != want || id.Name == ip || id.Name == keyName("k") {
				t.Errorf("X-User-ID %q under %d keys = %q, shares another namespace", uid, len(cfg.Keys), id.Name)
			}
		}
	}
}

// A key's users count against their key; no other identity shares a
// bucket, whatever X-User-ID it sends.
func TestBucket(t *testing.T) {
	t.Parallel()
	keys, _ := ParseKeys([]string{"k", "other"})
	keyed := NewResolver(Config{Keys: keys, TrustUserIDHeader: true})
	open := NewResolver(Config{TrustUserIDHeader: true})
	resolve := func(r *Resolver, auth, uid string) string {
		req := httptest.NewRequest(http.MethodPost, "/", nil)
		req.RemoteAddr = "127.0.0.1:1"
		if auth != "" {
			req.Header.Set("Authorization", "Bearer "+auth)
		}
		if uid != "" {
			req.Header.Set("X-User-ID", uid)
		}
		id, p := r.Resolve(req)
		if p != nil {
			t.Fatal(p)
		}
		return id.Name
	}
	for _, tc := range []struct {
		r         *Resolver
		auth, uid string
		want      string
	}{
		{keyed, "k", "", keyName("k")},
		{keyed, "k", "alice", keyName("k")},
		{keyed, "k", "bob", keyName("k")},
		{keyed, "k", "user:x", keyName("k")},
		{keyed, "other", "alice", keyName("other")},
		{open, "", "alice", "user:alice"},
		{open, "", "key:" + digestOf("k")[:12], "user:key:" + digestOf("k")[:12]},
		{open, "", "", "ip:127.0.0.1"},
	} {
		if got := Bucket(resolve(tc.r, tc.auth, tc.uid)); got != tc.want {
			t.Errorf("key %q X-User-ID %q: bucket %q, want %q", tc.auth, tc.uid, got, tc.want)
		}
	}
}

func FuzzResolve(f *testing.F) {
	f.Add("10.0.0.2:1", "1.2.3.4, 10.0.0.3", "5.6.7.8", "alice", "Bearer k")
	f.Add("[::1]:1", "::1,garbage", "", "ip:1.2.3.4", "bearer  k ")
	keys, _ := ParseKeys([]string{"k=high"})
	proxies, _ := ParseProxies([]string{"10.0.0.0/8", "::1"})
	r := NewResolver(Config{Keys: keys, TrustUserIDHeader: true, TrustedProxies: proxies})
	f.Fuzz(func(t *testing.T, remote, xff, realIP, uid, auth string) {
		req := httptest.NewRequest(http.MethodPost, "/", nil)
		req.RemoteAddr = remote
		req.Header.Set("X-Forwarded-For", xff)
		req.Header.Set("X-Real-IP", realIP)
		req.Header.Set("X-User-ID", uid)
		req.Header.Set("Authorization", auth)
		id, p := r.Resolve(req)
		if p == nil && !strings.HasPrefix(id.Name, "key:") {
			t.Fatalf("authenticated identity %q outside the key namespace", id.Name)
		}
		if a := r.ClientAddr(req); a.IsValid() && !a.Is4() && a.Is4In6() {
			t.Fatalf("address %s not unmapped", a)
		}
	})
}
