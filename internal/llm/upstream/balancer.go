package upstream

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/bits"
	"net"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/spillway-dev/spillway/internal/bounds"
	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/protocol"
)

// Sentinel errors of the Balancer.
var (
	// ErrNoUpstream means no upstream serving the model may take a call
	// now: each is full, sitting out or out of quota. The caller treats it
	// like a full pool: the request goes to the queue, a worker waits.
	ErrNoUpstream = fmt.Errorf("upstream: no upstream can take the call now: %w", llm.ErrNoCapacity)
	// ErrUnknownModel means no configured upstream serves the requested
	// model; the request is a client error (400).
	ErrUnknownModel = errors.New("upstream: no upstream serves the model")
	// errCircuitsOpen means every upstream that could take the call has
	// its circuit open (or sits out, with at least one circuit open). The
	// Balancer returns it inside a retryable *llm.Error whose RetryAfter
	// is the soonest an open circuit turns half-open; it wraps
	// llm.ErrCircuitOpen, so the api and the workers treat it as they
	// treat a single provider's open circuit (llm.IsCircuitOpen).
	errCircuitsOpen = fmt.Errorf("upstream: every upstream that could take the call has its circuit open: %w", llm.ErrCircuitOpen)
)

// Circuit is implemented by an upstream's provider that sits behind its
// own circuit breaker (breaker.Breaker): OpenFor says how long the
// circuit still refuses every call, 0 while it takes calls. The Balancer
// routes around an upstream whose circuit is open. It must read memory
// only: routing asks it on every call.
type Circuit interface {
	OpenFor() time.Duration
}

// Config configures a Balancer. Zero fields take the stated defaults.
type Config struct {
	// Routing is LLM_ROUTING: least-loaded (default), weighted, affinity
	// or latency.
	Routing string
	// AffinityBalance is LLM_AFFINITY_BALANCE. Default 1.5; at least 1.
	AffinityBalance float64
	// RetryAfterMax caps how long a 429's Retry-After sits an upstream out
	// (LLM_RETRY_AFTER_MAX_SECONDS). Default llm.DefaultRetryAfterMax, the
	// same cap the retry policy puts on a Retry-After.
	RetryAfterMax time.Duration
	// ProbeEvery is LLM_UPSTREAM_PROBE_SECONDS: how often one process
	// probes every upstream with GET {base_url}/models. 0 (default): health
	// is judged only by the calls upstreams get.
	ProbeEvery time.Duration
	// NonTextPartTokens is what one content part that is not text (an
	// image, audio, a file) counts in a call's token reservation
	// (NONTEXT_PART_TOKENS). Default 1000: never its base64 bytes, so one
	// photo does not reserve a minute's tpm.
	NonTextPartTokens int
}

// DefaultNonTextPartTokens is Config.NonTextPartTokens' default.
const DefaultNonTextPartTokens = 1000

// Validate reports bad values without changing c, each field out of range
// as a *bounds.Error. It checks AffinityBalance as given: New fills it in
// when zero before it calls Validate.
func (c Config) Validate() error {
	errs := []error{
		bounds.AtLeast("AffinityBalance", c.AffinityBalance, 1),
		bounds.AtLeast("RetryAfterMax", c.RetryAfterMax, 0),
		bounds.AtLeast("ProbeEvery", c.ProbeEvery, 0),
		bounds.AtLeast("NonTextPartTokens", c.NonTextPartTokens, 0),
	}
	if _, err := NewRouter(c.Routing, 0, DefaultAffinityBalance); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("upstream: %w", err)
	}
	return nil
}

// Deps are what a Balancer is built from. Caps, Health and Quota must have
// been built with the same Spec list, in the same order.
type Deps struct {
	// NewProvider builds the client of one upstream, typically an
	// llm.OpenAI on spec.BaseURL with spec.APIKey. Required.
	NewProvider func(spec Spec) (llm.Provider, error)
	// Caps holds each capped upstream under its max_concurrency. Nil means
	// in-process caps (NewLocalCaps).
	Caps Caps
	// Health says which upstreams take calls. Nil means in-process
	// health with the defaults (NewLocalHealth).
	Health Health
	// Quota spends rpm/tpm. Nil means in-process quotas (NewLocalQuota).
	Quota Quota
	// Metrics receives per-upstream observations. Nil means none.
	Metrics Metrics
	// Log receives the ejection and return lines. Nil means slog.Default.
	Log *slog.Logger
	// ProbeClient sends the probes. Nil means a client with a 5s timeout.
	ProbeClient *http.Client
}

// Balancer is an llm.Provider over several upstreams: it routes each call
// to one that may take it (healthy, serving the model, under its cap and
// quota), holds a slot of that upstream's cap for the call, and retries a
// retryable failure before the first chunk at once on another upstream,
// unseen by the caller. It is safe for concurrent use.
type Balancer struct {
	ups     []*Upstream
	router  Router
	caps    Caps
	health  Health
	quota   Quota
	metrics Metrics
	log     *slog.Logger
	cfg     Config
	prober  *http.Client
	models  []string // union; nil when some upstream serves any model
	line    line     // calls waiting for a slot (Acquire)

	stop context.CancelFunc
	done sync.WaitGroup
}

var (
	_ llm.Reserver    = (*Balancer)(nil)
	_ llm.Reservation = (*Reservation)(nil)
)

// New returns a Balancer over specs (as returned by Parse, at least one)
// and starts the goroutine that serves waiting calls and, when
// cfg.ProbeEvery is set, the probe goroutine; Close stops them. Close does
// not close deps: their owner does. A provider NewProvider returns that
// implements Circuit is routed around while its circuit is open.
func New(specs []Spec, cfg Config, deps Deps) (*Balancer, error) {
	if cfg.AffinityBalance == 0 {
		cfg.AffinityBalance = DefaultAffinityBalance
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if len(specs) == 0 || len(specs) > MaxUpstreams {
		return nil, fmt.Errorf("upstream: %d upstreams; want 1 to %d", len(specs), MaxUpstreams)
	}
	if deps.NewProvider == nil {
		return nil, errors.New("upstream: Deps.NewProvider is required")
	}
	if cfg.RetryAfterMax == 0 {
		cfg.RetryAfterMax = llm.DefaultRetryAfterMax
	}
	router, err := NewRouter(cfg.Routing, len(specs), cfg.AffinityBalance)
	if err != nil {
		return nil, err
	}
	b := &Balancer{
		router: router, caps: deps.Caps, health: deps.Health, quota: deps.Quota,
		metrics: deps.Metrics, log: deps.Log, cfg: cfg, prober: deps.ProbeClient,
	}
	if b.caps == nil {
		b.caps = NewLocalCaps(specs)
	}
	if b.health == nil {
		b.health = NewLocalHealth(len(specs), HealthConfig{}, nil)
	}
	if b.quota == nil {
		b.quota = NewLocalQuota(specs)
	}
	if b.metrics == nil {
		b.metrics = NopMetrics{}
	}
	if b.log == nil {
		b.log = slog.Default()
	}
	if b.prober == nil {
		b.prober = &http.Client{Timeout: 5 * time.Second}
	}
	anyModel := false
	for i, s := range specs {
		p, err := deps.NewProvider(s)
		if err != nil {
			return nil, fmt.Errorf("upstream: build client of %s: %w", s.Name, err)
		}
		u := &Upstream{Spec: s, index: i, nameHash: fnv64(s.Name), provider: p}
		if c, ok := p.(Circuit); ok {
			u.circuit = c
		}
		if s.MaxConcurrency > 0 {
			u.caps = b.caps
		}
		b.ups = append(b.ups, u)
		if len(s.Models) == 0 {
			anyModel = true
		}
		for _, m := range s.Models {
			if !slices.Contains(b.models, m) {
				b.models = append(b.models, m)
			}
		}
	}
	if anyModel {
		b.models = nil
	}
	slices.Sort(b.models)
	b.line.init()
	ctx, stop := context.WithCancel(context.Background())
	b.stop = stop
	b.done.Add(1)
	go b.dispatchLoop(ctx)
	if cfg.ProbeEvery > 0 {
		b.done.Add(1)
		go b.probeLoop(ctx)
	}
	return b, nil
}

// Close stops the waiting line's and the probe's goroutines and waits for
// them. Calls still waiting in Acquire wait until their context ends.
func (b *Balancer) Close() error {
	b.stop()
	b.done.Wait()
	return nil
}

// Name returns "upstreams".
func (b *Balancer) Name() string { return "upstreams" }

// Upstreams returns the live view of each upstream, in configured order.
func (b *Balancer) Upstreams() []*Upstream { return b.ups }

// Models returns the sorted union of the upstreams' models, or nil when
// some upstream serves any model (GET /v1/models then lists what it did
// before).
func (b *Balancer) Models() []string { return b.models }

// ask is what a reservation is for, beyond the request: the affinity key,
// the caller's identity (its turn in the waiting line, its calls in
// flight) and the upstreams already tried by this attempt.
type ask struct {
	key      string
	identity string
	since    time.Time
	tried    uint64
}

// askOf reads the caller (llm.WithCaller) from ctx: the affinity key is
// its Session, else the request's thread_id, else its Identity.
func askOf(ctx context.Context, req *protocol.ChatRequest) ask {
	c := llm.CallerFrom(ctx)
	a := ask{key: c.Session, identity: c.Identity, since: c.Since}
	if a.key == "" {
		a.key = req.ThreadID
	}
	if a.key == "" {
		a.key = c.Identity
	}
	return a
}

// Reservation is a held slot on one upstream for one call, from
// TryAcquire or Acquire. Stream uses it up; Release gives it back unused.
// A Reservation is used by one goroutine.
type Reservation struct {
	b       *Balancer
	u       *Upstream
	slot    Slot
	capped  bool
	trial   bool
	wait    bool // from Acquire: a retry waits for a slot too
	tokens  int
	ask     ask
	started time.Time
	done    bool
}

// Upstream returns the name of the upstream the reservation holds.
func (r *Reservation) Upstream() string { return r.u.Spec.Name }

// Release gives the slot back without calling; later calls do nothing.
func (r *Reservation) Release() {
	if r.done {
		return
	}
	r.done = true
	r.b.release(r)
}

// Stream implements llm.Provider: TryAcquire (Acquire when ctx was marked
// by llm.WithCapacityWait), then the reservation's Stream. It returns an
// error wrapping ErrNoUpstream when no upstream can take the call now,
// before calling anything, and a retryable *llm.Error whose cause says
// CircuitOpen when every upstream that could take it sits behind an open
// circuit (or sits out, with at least one circuit open).
func (b *Balancer) Stream(ctx context.Context, req protocol.ChatRequest, emit func(protocol.Chunk) error) (llm.Result, error) {
	acquire := b.TryAcquire
	if llm.CapacityWait(ctx) {
		// A queue worker waits for an upstream slot (llm.WithCapacityWait).
		acquire = b.Acquire
	}
	r, err := acquire(ctx, req)
	if err != nil {
		return llm.Result{}, err
	}
	return r.Stream(ctx, req, emit)
}

// TryAcquire reserves a slot on the upstream the router picks for req,
// never waiting: the api's direct path. It fails with ErrNoUpstream (the
// queue takes the request), ErrUnknownModel or the circuits-open error.
// Upstreams that calls waiting in this process (Acquire) could use are
// left to them: a new call does not take a slot from older ones.
func (b *Balancer) TryAcquire(ctx context.Context, req protocol.ChatRequest) (*Reservation, error) {
	return b.reserve(ctx, &req, askOf(ctx, &req), b.line.wanted.Load())
}

// Reserve implements llm.Reserver with TryAcquire: the api's direct path
// reserves an upstream before it commits to the direct path.
func (b *Balancer) Reserve(ctx context.Context, req protocol.ChatRequest) (llm.Reservation, error) {
	r, err := b.TryAcquire(ctx, req)
	if err != nil {
		return nil, err
	}
	return r, nil
}

// Acquire reserves like TryAcquire but waits while no upstream can take
// the call, until one can or ctx ends: the worker's path. Calls waiting in
// one process are served in turn (docs/UPSTREAMS.md, "Caps and quotas"):
// round-robin between identities (llm.Caller.Identity), oldest first
// within one (llm.Caller.Since), as workers wait for a pool slot. A retry
// inside the reservation's Stream waits the same way while an untried
// upstream is only full, not sitting out.
func (b *Balancer) Acquire(ctx context.Context, req protocol.ChatRequest) (*Reservation, error) {
	return b.acquire(ctx, &req, askOf(ctx, &req))
}

// anyUp reports whether an upstream serving model and not in tried is
// healthy or awaiting its trial, with its circuit not open: worth waiting
// for.
func (b *Balancer) anyUp(model string, tried uint64) bool {
	for i, u := range b.ups {
		if tried&(1<<i) == 0 && u.Spec.Serves(model) && b.health.State(i) != Ejected && u.openFor() == 0 {
			return true
		}
	}
	return false
}

// reserve picks and holds an upstream for req, skipping those in a.tried
// and in skip (upstreams left to waiting calls). O(upstreams) with no I/O
// except the cap's try (capped upstreams only), the quota (upstreams with
// rpm/tpm only) and a trial claim (only while an upstream awaits one).
func (b *Balancer) reserve(ctx context.Context, req *protocol.ChatRequest, a ask, skip uint64) (*Reservation, error) {
	now := time.Now()
	var eligible, trial uint64
	served := false
	down := true // every upstream passed over sits out or is behind an open circuit
	var openFor time.Duration
	for i, u := range b.ups {
		if !u.Spec.Serves(req.Model) {
			continue
		}
		served = true
		st := b.health.State(i)
		b.showHealth(u, st)
		if a.tried&(1<<i) != 0 {
			continue
		}
		if left := u.openFor(); left > 0 {
			if openFor == 0 || left < openFor {
				openFor = left
			}
			continue
		}
		if st == Ejected {
			continue
		}
		if skip&(1<<i) != 0 || now.UnixNano() < u.quotaUntil.Load() ||
			(u.caps != nil && u.caps.Load(i) >= u.caps.Limit(i)) {
			down = false
			continue
		}
		switch st {
		case Healthy:
			eligible |= 1 << i
		case Trial:
			trial |= 1 << i
		}
	}
	if !served {
		return nil, fmt.Errorf("%w: %q", ErrUnknownModel, req.Model)
	}
	if eligible != 0 || trial != 0 {
		down = false
	}
	textBytes := req.TextBytes
	if req.Body == nil { // a request built in code
		for _, m := range req.Messages {
			textBytes += len(m.Content)
		}
	}
	nonText := cmp.Or(b.cfg.NonTextPartTokens, DefaultNonTextPartTokens)
	tokens := EstimateTokens(textBytes, req.MaxTokens) + req.NonTextParts*nonText
	// An upstream waiting for its trial gets this call if this process
	// wins the claim: otherwise, with passive health, it would never come
	// back.
	for m := trial; m != 0; m &= m - 1 {
		i := bits.TrailingZeros64(m)
		if now.UnixNano() < b.ups[i].trialAfter.Load() {
			continue
		}
		b.ups[i].trialAfter.Store(now.Add(trialRetry).UnixNano())
		if !b.health.ClaimTrial(ctx, i) {
			continue
		}
		r, err := b.hold(ctx, b.ups[i], tokens, a)
		if err == nil {
			r.trial = true
			return r, nil
		}
		if ctx.Err() != nil {
			return nil, err
		}
	}
	for eligible != 0 {
		i := b.router.Pick(b.ups, Choice{Eligible: eligible, Key: a.key})
		if i < 0 {
			break
		}
		r, err := b.hold(ctx, b.ups[i], tokens, a)
		if err == nil {
			return r, nil
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("upstream: reserve: %w", ctx.Err())
		}
		eligible &^= 1 << i
	}
	if down && openFor > 0 {
		return nil, &llm.Error{Retryable: true, RetryAfter: openFor, Err: errCircuitsOpen}
	}
	return nil, ErrNoUpstream
}

// hold takes upstream u's cap slot and quota for one call. Its error is
// ErrFull, a quota refusal (ErrNoUpstream) or ctx's.
func (b *Balancer) hold(ctx context.Context, u *Upstream, tokens int, a ask) (*Reservation, error) {
	r := &Reservation{b: b, u: u, tokens: tokens, ask: a}
	if u.caps != nil {
		s, err := b.caps.TryAcquire(ctx, u.index)
		if err != nil {
			return nil, err
		}
		r.slot, r.capped = s, true
	}
	if u.Spec.RPM > 0 || u.Spec.TPM > 0 {
		ok, wait, err := b.quota.Reserve(ctx, u.index, tokens)
		if err != nil || !ok {
			if r.capped {
				b.caps.Release(r.slot)
			}
			if err != nil {
				return nil, err
			}
			u.quotaUntil.Store(time.Now().Add(wait).UnixNano())
			return nil, ErrNoUpstream
		}
	}
	b.metrics.InFlight(u.Spec.Name, int(u.local.Add(1)))
	b.line.held(a.identity, 1)
	return r, nil
}

func (b *Balancer) release(r *Reservation) {
	if r.capped {
		b.caps.Release(r.slot)
	}
	b.metrics.InFlight(r.u.Spec.Name, int(r.u.local.Add(-1)))
	b.line.held(r.ask.identity, -1)
}

// Stream calls the reserved upstream. A retryable failure before the first
// chunk is recorded against that upstream and the call goes at once to
// another eligible one not tried yet; when there is none, that failure is
// returned (still an *llm.Error a caller can retry after backoff). The
// reservation is used up either way.
func (r *Reservation) Stream(ctx context.Context, req protocol.ChatRequest, emit func(protocol.Chunk) error) (llm.Result, error) {
	if r.done {
		return llm.Result{}, errors.New("upstream: reservation already used")
	}
	b := r.b
	for {
		r.done = true
		res, first, err := b.call(ctx, r, req, emit)
		b.release(r)
		if err == nil {
			return res, nil
		}
		err = fmt.Errorf("upstream %s: %w", r.u.Spec.Name, err)
		if first || ctx.Err() != nil || !llm.IsRetryable(err) {
			return llm.Result{}, err
		}
		a := r.ask
		a.tried |= 1 << r.u.index
		var (
			next *Reservation
			nerr error
		)
		if r.wait {
			next, nerr = b.acquire(ctx, &req, a)
		} else {
			next, nerr = b.reserve(ctx, &req, a, b.line.wanted.Load())
		}
		if nerr != nil {
			return llm.Result{}, err
		}
		r = next
	}
}

// call streams one attempt on r's upstream and records what it shows:
// first-chunk latency, the outcome, health.
func (b *Balancer) call(ctx context.Context, r *Reservation, req protocol.ChatRequest, emit func(protocol.Chunk) error) (llm.Result, bool, error) {
	u := r.u
	r.started = time.Now()
	first := false
	res, err := u.provider.Stream(ctx, req, func(s protocol.Chunk) error {
		if !first && s.Output() {
			first = true
			d := time.Since(r.started)
			u.lat.observe(d, time.Now())
			b.metrics.FirstChunk(u.Spec.Name, d)
			b.succeeded(ctx, r, "first chunk")
		}
		return emit(s)
	})
	if err == nil {
		if !first {
			// An empty answer still proves the upstream answers.
			b.succeeded(ctx, r, "answer")
		}
		b.metrics.Request(u.Spec.Name, OutcomeOK)
		if u.Spec.TPM > 0 {
			if used := res.Usage.TotalTokens; used > r.tokens {
				b.quota.Charge(ctx, u.index, used-r.tokens)
			}
		}
		return res, first, nil
	}
	if ctx.Err() != nil && !first {
		return res, first, err // the caller left; says nothing of the upstream
	}
	if !first && llm.IsCircuitOpen(err) {
		// The upstream's own circuit refused the call without making it
		// (half-open with its trial calls taken, or it opened since the
		// pick): nothing to count, the next upstream is tried.
		return res, first, err
	}
	b.metrics.Request(u.Spec.Name, outcome(err))
	if !first && llm.IsRetryable(err) {
		b.failed(ctx, r, err)
	}
	return res, first, err
}

func (b *Balancer) succeeded(ctx context.Context, r *Reservation, by string) {
	back, err := b.health.Succeeded(ctx, r.u.index)
	if err != nil {
		b.log.Warn("upstream: recording a success failed", "upstream", r.u.Spec.Name, "error", err)
	}
	if back {
		b.log.Info("upstream: returned", "upstream", r.u.Spec.Name, "reason", "trial call's "+by)
		b.showHealth(r.u, Healthy)
	}
}

func (b *Balancer) failed(ctx context.Context, r *Reservation, cause error) {
	f := Failure{Trial: r.trial, Reason: cause.Error()}
	var le *llm.Error
	if errors.As(cause, &le) && le.Status == http.StatusTooManyRequests && le.RetryAfter > 0 {
		f.SitOut = min(le.RetryAfter, b.cfg.RetryAfterMax)
	}
	b.recordFailure(ctx, r.u, f)
}

func (b *Balancer) recordFailure(ctx context.Context, u *Upstream, f Failure) {
	ejected, err := b.health.Failed(ctx, u.index, f)
	if err != nil {
		b.log.Warn("upstream: recording a failure failed", "upstream", u.Spec.Name, "error", err)
		return
	}
	if ejected {
		sitOut := "cooldown"
		if f.SitOut > 0 {
			sitOut = "Retry-After " + f.SitOut.String()
		}
		b.log.Warn("upstream: ejected", "upstream", u.Spec.Name, "reason", f.Reason, "sits_out", sitOut, "trial", f.Trial)
		b.showHealth(u, Ejected)
	}
}

// showHealth reports u's health gauge when it changed, so the request path
// costs one atomic load per upstream.
func (b *Balancer) showHealth(u *Upstream, st State) {
	v := int32(1)
	if st != Healthy {
		v = 2
	}
	if u.shown.Swap(v) != v {
		b.metrics.Healthy(u.Spec.Name, v == 1)
	}
}

// outcome classifies a failed call for spillway_upstream_requests_total.
func outcome(err error) string {
	var le *llm.Error
	if errors.As(err, &le) && le.Status == http.StatusTooManyRequests {
		return OutcomeThrottled
	}
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) {
		return OutcomeTimeout
	}
	return OutcomeError
}
