// Package kafkatest starts in-process Kafka-protocol brokers (franz-go's
// kfake) for integration tests of the Kafka failover queue, so those tests
// need no JVM and no docker. Each Start is one cluster owned by one test.
package kafkatest

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
)

// Cluster is a running kfake cluster owned by one test.
type Cluster struct {
	// Brokers are the listen addresses ("127.0.0.1:port"), one per broker.
	Brokers []string

	c    *kfake.Cluster
	once sync.Once
}

// Defaults of Start: one broker, topics auto-created with 4 partitions
// (KAFKA_PARTITIONS' default, docs/OPERATIONS.md), and consumer-group session timeouts
// down to one second so a rebalance after a member leaves or dies takes
// seconds, not the broker default's six.
const (
	DefaultPartitions        = 4
	DefaultMinSessionTimeout = time.Second
)

// Start runs a kfake cluster on random loopback ports and stops it when the
// test ends. opts are appended to the defaults, so they may override them
// (kfake.NumBrokers(3) for a three-broker cluster). With -short the
// calling test is skipped, like every integration test.
func Start(tb testing.TB, opts ...kfake.Opt) *Cluster {
	tb.Helper()
	if testing.Short() {
		tb.Skip("kafkatest: integration test skipped with -short")
	}
	all := append([]kfake.Opt{
		kfake.NumBrokers(1),
		kfake.AllowAutoTopicCreation(),
		kfake.DefaultNumPartitions(DefaultPartitions),
		kfake.GroupMinSessionTimeout(DefaultMinSessionTimeout),
	}, opts...)
	c, err := kfake.NewCluster(all...)
	if err != nil {
		tb.Fatalf("kafkatest: start kfake: %v", err)
	}
	cl := &Cluster{Brokers: c.ListenAddrs(), c: c}
	tb.Cleanup(cl.Stop)
	return cl
}

// Stop shuts the cluster down: listeners close, so clients see refused
// connections from then on. Safe to call more than once.
func (c *Cluster) Stop() { c.once.Do(c.c.Close) }

// Kfake returns the underlying cluster for fault injection (Control,
// MoveTopicPartition, ...).
func (c *Cluster) Kfake() *kfake.Cluster { return c.c }

var seq atomic.Int64

// Name returns a topic or group name unique in this process, derived from
// the test's name, so tests sharing one cluster never see each other's
// topics. Kafka allows only [a-zA-Z0-9._-] and at most 249 characters.
func Name(tb testing.TB) string {
	tb.Helper()
	clean := strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '.', r == '-':
			return r
		default:
			return '_'
		}
	}, tb.Name())
	if len(clean) > 180 {
		clean = clean[len(clean)-180:]
	}
	return fmt.Sprintf("t%d_%s", seq.Add(1), clean)
}
