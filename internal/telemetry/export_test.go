package telemetry

import (
	"github.com/segmentio/kafka-go"

	"github.com/spillway-dev/spillway/internal/protocol"
)

// KafkaHeaders returns the record headers that carry tc: what the Kafka
// queue writes instead of the job's trace field. Nil when tc is nil.
func KafkaHeaders(tc *protocol.TraceContext) []kafka.Header {
	if tc == nil {
		return nil
	}
	return appendKafkaHeaders(nil, tc)
}
