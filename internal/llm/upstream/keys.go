package upstream

// Redis key and channel names, one builder each. prefix is the Prefix of
// RedisCaps, RedisHealth and RedisQuota (default "upstream:"). Every name
// carries the {pool} hash tag of the Redis pool's keys, so one script may
// later take a pool slot and an upstream slot in one call on Redis Cluster.

const hashTag = "{pool}"

// DefaultPrefix is the default key prefix of the Redis implementations.
const DefaultPrefix = "upstream:"

// InFlightKey is the ZSET of an upstream's call slots: member lease id,
// score its expiry in Unix ms (Redis clock). "upstream:{pool}:inflight:<name>".
func InFlightKey(prefix, name string) string { return prefix + hashTag + ":inflight:" + name }

// CapsChannel carries "<count> <name>" at every release, so every process
// learns the counts and its waiting workers wake. "upstream:{pool}:caps".
func CapsChannel(prefix string) string { return prefix + hashTag + ":caps" }

// FailsKey counts an upstream's consecutive retryable failures, cluster-wide.
func FailsKey(prefix, name string) string { return prefix + hashTag + ":fails:" + name }

// DownKey exists while an upstream sits out; its TTL is the time left and
// its value the reason.
func DownKey(prefix, name string) string { return prefix + hashTag + ":down:" + name }

// SuspectKey exists from an ejection until a probe or trial call succeeds:
// once DownKey has expired, the upstream waits for that one trial.
func SuspectKey(prefix, name string) string { return prefix + hashTag + ":suspect:" + name }

// TrialKey is held (SET NX) by the one process or call that tries a
// suspect upstream.
func TrialKey(prefix, name string) string { return prefix + hashTag + ":trial:" + name }

// HealthChannel carries an upstream's name at every ejection and return.
func HealthChannel(prefix string) string { return prefix + hashTag + ":health" }

// ProbeLockKey is held by the one process that probes this round.
func ProbeLockKey(prefix string) string { return prefix + hashTag + ":probe" }

// quotaKey names an upstream's GCRA state for kind "rpm" or "tpm";
// redis_rate stores it under "rate:" + this.
func quotaKey(prefix, name, kind string) string { return prefix + hashTag + ":" + kind + ":" + name }
