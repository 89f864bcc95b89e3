package redispool

// Key and channel names, one builder each. prefix is Config.Prefix
// (default "pool:"). Every name carries the {pool} hash tag so the keys
// one script touches land in one Redis Cluster slot.

const hashTag = "{pool}"

// LeasesKey is the ZSET of every live lease: member lease id, score its
// expiry in Unix milliseconds (Redis clock). "pool:{pool}:leases".
func LeasesKey(prefix string) string { return prefix + hashTag + ":leases" }

// UserKey is the ZSET of one user's leases, with the same members and
// scores as LeasesKey. "pool:{pool}:user:<user>".
func UserKey(prefix, user string) string { return userKeyPrefix(prefix) + user }

func userKeyPrefix(prefix string) string { return prefix + hashTag + ":user:" }

// WaitersKey is the ZSET of registered waiters (Acquire calls waiting for
// a slot, cluster-wide): member "<16 hex id>:<user>", score the enqueue
// time in Unix microseconds (Redis clock). "pool:{pool}:waiters".
func WaitersKey(prefix string) string { return prefix + hashTag + ":waiters" }

// WaiterExpiryKey is the ZSET of the same waiters scored by expiry in Unix
// milliseconds: a waiter whose process stops refreshing it drops out.
// "pool:{pool}:waiters:expiry".
func WaiterExpiryKey(prefix string) string { return prefix + hashTag + ":waiters:expiry" }

// NotifyChannel is the Pub/Sub channel on which releases (and waiters that
// give up) wake the waiters of every process. "pool:{pool}:notify".
func NotifyChannel(prefix string) string { return prefix + hashTag + ":notify" }

// ReclaimChannel is the Pub/Sub channel on which the pool asks every
// process to give back the idle leases it keeps for reuse (idle.go): a
// waiter joined the line, a direct request found no free slot or its user
// at the limit, or an adaptive limit fell. "pool:{pool}:reclaim".
func ReclaimChannel(prefix string) string { return prefix + hashTag + ":reclaim" }

// LimitKey is the HASH of the adaptive limit called name (adapt.lua):
// limit, and the interval being counted. The pool's own limit is named
// by Config.AdaptiveLimit. "pool:{pool}:limit:<name>".
func LimitKey(prefix, name string) string { return prefix + hashTag + ":limit:" + name }
