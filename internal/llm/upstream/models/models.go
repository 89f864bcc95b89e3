// Package models owns the model list of GET /v1/models and
// GET /v1/models/{id}: the union of the upstreams' own lists (each one's
// GET {base_url}/models, its objects passed on as the upstream sent them)
// and the models Spillway always names, deduplicated by id and cached
// (docs/API.md, "Models").
package models

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"

	"github.com/spillway-dev/spillway/internal/bounds"
	"github.com/spillway-dev/spillway/internal/llm/upstream"
	"github.com/spillway-dev/spillway/internal/openaiwire"
)

// DefaultTTL is how long a list is served before the next request asks
// the upstreams again (MODELS_CACHE_SECONDS).
const DefaultTTL = 60 * time.Second

// DefaultTimeout bounds one upstream's list call.
const DefaultTimeout = 10 * time.Second

// maxListBytes bounds an upstream's list body: OpenAI's own is ~100 KB,
// the largest aggregators' a few MB.
const maxListBytes = 16 << 20

// Config configures a Catalog.
type Config struct {
	// Upstreams are asked for their lists, in this order; the first one
	// that lists an id gives its object. Of an upstream with Models, only
	// those are listed (it is sent no others). Empty with the simulator.
	Upstreams []upstream.Spec
	// Always are ids listed whether an upstream lists them or not
	// (LLM_MODEL, the simulator's model, the upstreams' configured
	// `models:`); one no upstream lists gets an object of Spillway's.
	Always []string
	// Allow, when not empty, are the only ids listed, in this order
	// (LLM_MODELS); each is listed even if no upstream lists it.
	Allow []string
	// TTL is how long a list is served before the next request refreshes
	// it (MODELS_CACHE_SECONDS, default DefaultTTL); 0 asks the upstreams
	// on every request, a burst still making one call per upstream.
	TTL time.Duration
	// Timeout bounds one upstream's list call. Zero means DefaultTimeout.
	Timeout time.Duration
	// Client makes the list calls. Nil means a client of its own.
	Client *http.Client
	// Now is the clock. Nil means time.Now.
	Now func() time.Time
}

// Validate reports a Config New would refuse, TTL out of range as a
// *bounds.Error.
func (c Config) Validate() error {
	var errs []error
	if err := bounds.AtLeast("TTL", c.TTL, 0); err != nil {
		errs = append(errs, fmt.Errorf("models: %w", err))
	}
	if c.Timeout < 0 {
		errs = append(errs, fmt.Errorf("models: timeout %v must not be negative", c.Timeout))
	}
	for i, s := range c.Upstreams {
		if strings.TrimSpace(s.BaseURL) == "" {
			errs = append(errs, fmt.Errorf("models: upstream %d (%s) has no base URL", i, s.Name))
		}
	}
	for _, id := range append(append([]string(nil), c.Always...), c.Allow...) {
		if id == "" {
			errs = append(errs, errors.New("models: an always-listed or allowed model id is empty"))
			break
		}
	}
	return errors.Join(errs...)
}

// Catalog serves the model list. It is safe for concurrent use; a request
// that finds the list older than the TTL refreshes it, and the requests
// arriving meanwhile wait for that one refresh (one call per upstream).
type Catalog struct {
	cfg     Config
	log     *slog.Logger
	created int64 // the created stamp of Spillway's own objects
	sf      singleflight.Group

	mu  sync.Mutex
	cur *snapshot
}

// snapshot is one refreshed list.
type snapshot struct {
	at   time.Time
	list []byte            // the GET /v1/models body
	byID map[string][]byte // each listed object, as listed
}

// New returns a Catalog for cfg. log receives one line per upstream whose
// list call fails.
func New(cfg Config, log *slog.Logger) (*Catalog, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.Client == nil {
		cfg.Client = &http.Client{}
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Catalog{cfg: cfg, log: log, created: cfg.Now().Unix()}, nil
}

// snapshot returns the current list, refreshing it first when it is older
// than the TTL. The refresh does not end with the request that started
// it: the others waiting on it share its result.
func (c *Catalog) snapshot(ctx context.Context) *snapshot {
	c.mu.Lock()
	s := c.cur
	c.mu.Unlock()
	if s != nil && c.cfg.Now().Sub(s.at) < c.cfg.TTL {
		return s
	}
	v, _, _ := c.sf.Do("list", func() (any, error) {
		ns := c.refresh(context.WithoutCancel(ctx))
		c.mu.Lock()
		c.cur = ns
		c.mu.Unlock()
		return ns, nil
	})
	return v.(*snapshot)
}

// refresh asks every upstream for its list at once and builds the union.
func (c *Catalog) refresh(ctx context.Context) *snapshot {
	at := c.cfg.Now()
	lists := make([][]object, len(c.cfg.Upstreams))
	var wg sync.WaitGroup
	for i, u := range c.cfg.Upstreams {
		wg.Go(func() {
			objs, err := c.fetch(ctx, u)
			if err != nil {
				c.log.Warn("upstream model list failed; its models are left out until the next refresh",
					"upstream", u.Name, "err", err)
				return
			}
			lists[i] = objs
		})
	}
	wg.Wait()

	byID := make(map[string][]byte)
	var order []string
	add := func(id string, raw []byte) {
		if _, ok := byID[id]; ok {
			return
		}
		byID[id] = raw
		order = append(order, id)
	}
	for i, objs := range lists {
		// An upstream with a `models:` list is sent only those, so only
		// those of its list are listed.
		u := c.cfg.Upstreams[i]
		for _, o := range objs {
			if len(u.Models) == 0 || slices.Contains(u.Models, o.id) {
				add(o.id, o.raw)
			}
		}
	}
	for _, id := range c.cfg.Always {
		add(id, c.own(id))
	}
	if len(c.cfg.Allow) > 0 {
		allowed := make(map[string][]byte, len(c.cfg.Allow))
		order = order[:0]
		for _, id := range c.cfg.Allow {
			if _, dup := allowed[id]; dup {
				continue
			}
			raw, ok := byID[id]
			if !ok {
				raw = c.own(id)
			}
			allowed[id] = raw
			order = append(order, id)
		}
		byID = allowed
	}

	var b bytes.Buffer
	b.WriteString(`{"object":"list","data":[`)
	for i, id := range order {
		if i > 0 {
			b.WriteByte(',')
		}
		b.Write(byID[id])
	}
	b.WriteString("]}\n")
	return &snapshot{at: at, list: b.Bytes(), byID: byID}
}

// own is Spillway's object for a model no upstream listed.
func (c *Catalog) own(id string) []byte {
	b, _ := json.Marshal(openaiwire.Model{ID: id, Object: openaiwire.ObjectModel, Created: c.created, OwnedBy: openaiwire.OwnedBy}) // strings and ints only
	return b
}

// object is one entry of an upstream's list: its id and its bytes.
type object struct {
	id  string
	raw []byte
}

// fetch asks u for its list. Entries without a string id are skipped.
func (c *Catalog) fetch(ctx context.Context, u upstream.Spec) ([]object, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	url := strings.TrimSuffix(u.BaseURL, "/") + "/models"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("models: build request to %s: %w", url, err)
	}
	req.Header.Set("Accept", "application/json")
	if u.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+u.APIKey)
	}
	resp, err := c.cfg.Client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("models: GET %s: %w", url, err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxListBytes+1))
	if err != nil {
		return nil, fmt.Errorf("models: read %s: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("models: GET %s: status %d", url, resp.StatusCode)
	}
	if len(body) > maxListBytes {
		return nil, fmt.Errorf("models: GET %s: list larger than %d bytes", url, maxListBytes)
	}
	var list struct {
		Data []json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(body, &list); err != nil {
		return nil, fmt.Errorf("models: GET %s: not a model list: %w", url, err)
	}
	objs := make([]object, 0, len(list.Data))
	for _, raw := range list.Data {
		var head struct {
			ID string `json:"id"`
		}
		if json.Unmarshal(raw, &head) != nil || head.ID == "" {
			continue
		}
		objs = append(objs, object{id: head.ID, raw: raw})
	}
	return objs, nil
}

// ServeList answers GET /v1/models: {"object":"list","data":[…]}.
func (c *Catalog) ServeList(w http.ResponseWriter, r *http.Request) {
	s := c.snapshot(r.Context())
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(s.list)
}

// ServeModel answers GET /v1/models/{id} with the model's object, or a
// 404 in OpenAI's error shape with code model_not_found.
func (c *Catalog) ServeModel(w http.ResponseWriter, r *http.Request, id string) {
	s := c.snapshot(r.Context())
	w.Header().Set("Content-Type", "application/json")
	raw, ok := s.byID[id]
	if !ok {
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(http.StatusNotFound)
		b, _ := json.Marshal(notFound{Error: notFoundError{ // strings only
			Message: fmt.Sprintf("The model '%s' does not exist or you do not have access to it.", id),
			Type:    openaiwire.TypeInvalidRequest, Code: "model_not_found",
		}})
		_, _ = w.Write(append(b, '\n'))
		return
	}
	_, _ = w.Write(append(raw[:len(raw):len(raw)], '\n'))
}

// notFound is OpenAI's answer to an unknown model, param null included.
type notFound struct {
	Error notFoundError `json:"error"`
}

type notFoundError struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    string  `json:"code"`
}
