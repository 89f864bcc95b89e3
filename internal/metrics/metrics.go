// Package metrics owns Spillway's Prometheus metrics: every name
// docs/OPERATIONS.md lists, registered once per process on a registry the
// caller provides. Components do not take *Metrics whole: each states the
// small interface it counts through (gateway.Metrics, worker.Metrics,
// stream.Metrics), which *Metrics implements with the methods in
// observe.go. Path label values are the wire's (protocol.PathDirect,
// protocol.PathQueued).
package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/spillway-dev/spillway/internal/protocol"
)

// Stream outcome label values of spillway_streams_total.
const (
	OutcomeDone      = "done"
	OutcomeError     = "error"
	OutcomeCancelled = "cancelled"
	OutcomeRefused   = "refused"
)

// Worker job outcome label values of spillway_worker_jobs_total.
const (
	JobDone       = "done"
	JobError      = "error"
	JobExpired    = "expired"
	JobCancelled  = "cancelled"
	JobDeadLetter = "dead_letter"
)

// RetryReasons are the reason label values of
// spillway_worker_retries_total that are pre-created: llm.Reason's values
// a worker retries on, and circuit_open for a wait on an open circuit.
var RetryReasons = []string{"timeout", "throttled", "server_error", "connection", "circuit_open"}

// Metrics holds every Spillway collector. Gauges whose value lives
// elsewhere (pool slots, queue depth) are set by their owners.
type Metrics struct {
	StreamsTotal      *prometheus.CounterVec   // spillway_streams_total{path,outcome}
	ActiveStreams     *prometheus.GaugeVec     // spillway_active_streams{path}
	TimeToFirstChunk  *prometheus.HistogramVec // spillway_time_to_first_chunk_seconds{path}
	PoolSlotsInUse    prometheus.Gauge         // spillway_pool_slots_in_use
	PoolSlotsCapacity prometheus.Gauge         // spillway_pool_slots_capacity
	PoolFallback      prometheus.Gauge         // spillway_pool_fallback
	PoolLimit         prometheus.Gauge         // spillway_pool_effective_limit
	PoolRefusals      *prometheus.CounterVec   // spillway_pool_refusals_total{limit}
	QueueDepth        prometheus.Gauge         // spillway_queue_depth
	QueueThreshold    prometheus.Gauge         // spillway_queue_threshold
	QueueRejections   *prometheus.CounterVec   // spillway_queue_rejections_total{reason,priority}
	QueueWait         prometheus.Histogram     // spillway_queue_wait_seconds
	WorkerJobs        *prometheus.CounterVec   // spillway_worker_jobs_total{outcome}
	WorkerRetries     *prometheus.CounterVec   // spillway_worker_retries_total{reason}
	UpstreamResponses *prometheus.CounterVec   // spillway_upstream_responses_total{upstream,code}
	DeadLetterDepth   prometheus.Gauge         // spillway_dead_letter_depth
	CircuitState      *prometheus.GaugeVec     // spillway_circuit_state{provider}
	RateLimited       prometheus.Counter       // spillway_rate_limited_total
	MalformedMessages *prometheus.CounterVec   // spillway_malformed_messages_total{source}
	SubscriptionsLost *prometheus.CounterVec   // spillway_subscriptions_lost_total{reason}
	ResultsDropped    *prometheus.CounterVec   // spillway_results_dropped_total{reason}
	StreamGaps        *prometheus.CounterVec   // spillway_stream_gaps_total{outcome}
	StreamLogDropped  prometheus.Counter       // spillway_stream_log_dropped_total
	TraceInvalid      prometheus.Counter       // spillway_trace_context_invalid_total
	DegradationLevel  prometheus.Gauge         // spillway_degradation_level
	DegradationInput  *prometheus.GaugeVec     // spillway_degradation_input{input}
	RedisCommand      *prometheus.HistogramVec // spillway_redis_command_seconds{op}
}

// latencyBuckets cover sub-millisecond overheads up to minute-long waits.
var latencyBuckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}

// redisBuckets resolve a healthy Redis (tens of µs) up to a call timeout.
var redisBuckets = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5}

// New creates every collector and registers it on reg.
func New(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		StreamsTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "spillway_streams_total", Help: "Streams by path and outcome (done, error, cancelled, refused).",
		}, []string{"path", "outcome"}),
		ActiveStreams: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "spillway_active_streams", Help: "Open SSE streams by path.",
		}, []string{"path"}),
		TimeToFirstChunk: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "spillway_time_to_first_chunk_seconds", Help: "Request arrival to first chunk written, by path.",
			Buckets: latencyBuckets,
		}, []string{"path"}),
		PoolSlotsInUse: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "spillway_pool_slots_in_use", Help: "Provider slots in use (cluster-wide for the Redis pool).",
		}),
		PoolSlotsCapacity: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "spillway_pool_slots_capacity", Help: "Provider slots in all (CONNECTION_POOL_SIZE, or the fallback size).",
		}),
		PoolFallback: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "spillway_pool_fallback", Help: "1 while the Redis pool has fallen back to a local limit.",
		}),
		PoolLimit: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "spillway_pool_effective_limit", Help: "Provider calls at once the pool allows now: CONNECTION_POOL_SIZE, lowered by adaptive concurrency (cluster-wide for the Redis pool).",
		}),
		PoolRefusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "spillway_pool_refusals_total", Help: "TryAcquire refusals by limit (global, user).",
		}, []string{"limit"}),
		QueueDepth: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "spillway_queue_depth", Help: "Jobs accepted and not yet acknowledged (cached).",
		}),
		QueueThreshold: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "spillway_queue_threshold", Help: "QUEUE_OVERFLOW_THRESHOLD.",
		}),
		QueueRejections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "spillway_queue_rejections_total", Help: "Requests refused instead of queued, by reason and priority.",
		}, []string{"reason", "priority"}),
		QueueWait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "spillway_queue_wait_seconds", Help: "Enqueue to a worker starting the job.",
			Buckets: latencyBuckets,
		}),
		WorkerJobs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "spillway_worker_jobs_total", Help: "Jobs finished by workers, by outcome.",
		}, []string{"outcome"}),
		WorkerRetries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "spillway_worker_retries_total", Help: "Provider calls retried by workers, by why the last one failed.",
		}, []string{"reason"}),
		UpstreamResponses: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "spillway_upstream_responses_total", Help: "Provider calls that got a response, by upstream and HTTP status (200 also for a failure inside a stream).",
		}, []string{"upstream", "code"}),
		DeadLetterDepth: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "spillway_dead_letter_depth", Help: "Entries in the dead-letter queue.",
		}),
		CircuitState: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "spillway_circuit_state", Help: "Provider circuit: 0 closed, 1 half-open, 2 open.",
		}, []string{"provider"}),
		RateLimited: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "spillway_rate_limited_total", Help: "Requests refused with 429.",
		}),
		MalformedMessages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "spillway_malformed_messages_total", Help: "Queue or result messages that could not be decoded and were skipped, by source.",
		}, []string{"source"}),
		SubscriptionsLost: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "spillway_subscriptions_lost_total", Help: "Result subscriptions ended by the subscriber (overflow, connection_lost).",
		}, []string{"reason"}),
		ResultsDropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "spillway_results_dropped_total", Help: "Result messages the api's relay did not pass on, by reason (stale_attempt, duplicate).",
		}, []string{"reason"}),
		StreamGaps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "spillway_stream_gaps_total", Help: "Gaps in queued answers' sequence, by outcome (healed, broken).",
		}, []string{"outcome"}),
		StreamLogDropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "spillway_stream_log_dropped_total", Help: "Stream log entries dropped because Redis fell too far behind; a resume of their streams ends at the gap.",
		}),
		RedisCommand: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "spillway_redis_command_seconds", Help: "Redis commands as this process saw them (queueing for a connection included), by command (evalsha for scripts, pipeline for pipelines).",
			Buckets: redisBuckets,
		}, []string{"op"}),
		TraceInvalid: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "spillway_trace_context_invalid_total", Help: "Trace fields of jobs or records that were present but unusable; the job ran as the root of a new trace.",
		}),
		DegradationLevel: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "spillway_degradation_level", Help: "Degradation level: 0 normal, 1 elevated, 2 high, 3 critical.",
		}),
		DegradationInput: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "spillway_degradation_input", Help: "The inputs of the degradation level as last read, by input (its unit in its name).",
		}, []string{"input"}),
	}
	reg.MustRegister(m.StreamsTotal, m.ActiveStreams, m.TimeToFirstChunk, m.PoolSlotsInUse,
		m.PoolSlotsCapacity, m.PoolFallback, m.PoolRefusals, m.QueueDepth, m.QueueThreshold,
		m.QueueRejections, m.QueueWait, m.WorkerJobs, m.WorkerRetries, m.UpstreamResponses, m.DeadLetterDepth,
		m.CircuitState, m.RateLimited, m.MalformedMessages, m.SubscriptionsLost, m.ResultsDropped, m.StreamGaps,
		m.TraceInvalid, m.RedisCommand, m.PoolLimit, m.DegradationLevel, m.DegradationInput, m.StreamLogDropped)
	// Pre-create label sets so dashboards see zeros rather than gaps.
	for _, p := range []string{protocol.PathDirect, protocol.PathQueued} {
		m.ActiveStreams.WithLabelValues(p)
		for _, o := range []string{OutcomeDone, OutcomeError, OutcomeCancelled, OutcomeRefused} {
			m.StreamsTotal.WithLabelValues(p, o)
		}
	}
	for _, r := range []string{"overflow", "degraded", "timeout", "enqueue_failed", "subscribe_failed", "too_large", "circuit_open"} {
		for _, p := range protocol.Priorities {
			m.QueueRejections.WithLabelValues(r, string(p))
		}
	}
	for _, o := range []string{JobDone, JobError, JobExpired, JobCancelled, JobDeadLetter} {
		m.WorkerJobs.WithLabelValues(o)
	}
	for _, r := range RetryReasons {
		m.WorkerRetries.WithLabelValues(r)
	}
	for _, r := range []string{"stale_attempt", "duplicate"} {
		m.ResultsDropped.WithLabelValues(r)
	}
	for _, o := range []string{"healed", "broken"} {
		m.StreamGaps.WithLabelValues(o)
	}
	return m
}

// DocumentedNames lists every metric name docs/OPERATIONS.md promises, for tests that
// check /metrics exposes them.
var DocumentedNames = []string{
	"spillway_streams_total", "spillway_active_streams", "spillway_time_to_first_chunk_seconds",
	"spillway_pool_slots_in_use", "spillway_pool_slots_capacity", "spillway_pool_fallback",
	"spillway_queue_depth", "spillway_queue_threshold", "spillway_queue_rejections_total",
	"spillway_queue_wait_seconds", "spillway_worker_jobs_total", "spillway_worker_retries_total",
	"spillway_dead_letter_depth", "spillway_circuit_state", "spillway_rate_limited_total",
	"spillway_upstream_responses_total", "spillway_pool_effective_limit", "spillway_degradation_level",
}
