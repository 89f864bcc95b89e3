package kafka

import (
	"strings"
	"testing"

	"github.com/spillway-dev/spillway/internal/bounds"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

// Partitions and ReplicationFactor out of range are *bounds.Errors
// naming the field; New fills a zero one with its default first.
func TestConfigBounds(t *testing.T) {
	t.Parallel()
	b := []string{"127.0.0.1:9092"}
	if err := (Config{Brokers: b, Partitions: 1, ReplicationFactor: 1}).Validate(); err != nil {
		t.Errorf("edge values: %v", err)
	}
	err := Config{Brokers: b}.Validate()
	if !testutil.HasBound(err, "Partitions") || !testutil.HasBound(err, "ReplicationFactor") || len(bounds.Errors(err)) != 2 {
		t.Errorf("Validate() = %v, want bounds errors for Partitions and ReplicationFactor", err)
	}
	if _, err := New(Config{Brokers: b}, nil); err == nil || len(bounds.Errors(err)) != 0 {
		t.Errorf("New with defaults and no logger = %v, want only the logger refused", err)
	}
}

// A broker address with a user part is refused, and the error does not
// quote it: the part before the @ may be a secret.
func TestConfigBrokerWithUserPart(t *testing.T) {
	t.Parallel()
	for _, b := range []string{"s3cret@kafka:9092", "user:s3cret@kafka:9092"} {
		err := Config{Brokers: []string{"kafka:9093", b}, Partitions: 1, ReplicationFactor: 1}.Validate()
		if err == nil || !strings.Contains(err.Error(), "user part") {
			t.Errorf("Brokers %q: Validate() = %v, want the user part refused", b, err)
		}
		if err != nil && strings.Contains(err.Error(), "s3cret") {
			t.Errorf("Brokers %q: error %q shows the secret", b, err)
		}
	}
}
