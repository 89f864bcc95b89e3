package protocol

import (
	"fmt"
)

// MaxJobBytes bounds one encoded job; DecodeJob refuses larger input. A
// job carries its request body whole (images travel inline), so the api's
// MAX_BODY_BYTES is held under it (config validation).
const MaxJobBytes = 64 << 20

// EncodeJob returns the wire form of j, stamping the current JobVersion. It
// refuses a job larger than MaxJobBytes, which DecodeJob would refuse. A
// trace context that fails TraceContext.Validate is left out rather than
// failing the job: DecodeJob would drop it anyway.
func EncodeJob(j Job) ([]byte, error) {
	j.Version = JobVersion
	j.Trace, _ = normalizeTrace(j.Trace)
	body := j.Payload.Body
	if body != nil {
		// The body travels as it is, byte for byte, spliced in after the
		// rest is encoded (encoding/json would compact it); the payload's
		// fields are read from it again by DecodeJob.
		j.Route = j.Payload.Route
		j.Payload = ChatRequest{}
	}
	j.Body = nil
	b, err := appendJSON(nil, j)
	if err != nil {
		return nil, fmt.Errorf("protocol: encode job %s: %w", j.RequestID, err)
	}
	if body != nil {
		b = append(b[:len(b)-1], `,"body":`...)
		b = append(append(b, body...), '}')
	}
	if len(b) > MaxJobBytes {
		return nil, fmt.Errorf("protocol: encode job %s: %d bytes exceeds %d", j.RequestID, len(b), MaxJobBytes)
	}
	return b, nil
}

// DecodeJob parses and checks a job read from a queue. It never panics; an
// input it cannot accept gives an error wrapping ErrMalformed, and such a
// job belongs in the dead-letter queue. A trace field is the exception: one
// that is malformed or out of bounds is dropped (Trace nil, TraceDropped
// set) and the job is still run.
func DecodeJob(b []byte) (Job, error) {
	if len(b) > MaxJobBytes {
		return Job{}, fmt.Errorf("%w: job of %d bytes exceeds %d", ErrMalformed, len(b), MaxJobBytes)
	}
	var j Job
	if err := strictUnmarshal(b, &j); err != nil {
		return Job{}, fmt.Errorf("%w: job: %v", ErrMalformed, err)
	}
	if j.Version != 1 && j.Version != JobVersion {
		return Job{}, fmt.Errorf("%w: job version %d, want 1 or %d", ErrMalformed, j.Version, JobVersion)
	}
	if j.RequestID == "" || len(j.RequestID) > 128 || !validIDChars(j.RequestID) {
		// Quote at most 128 bytes: a request_id can be megabytes long.
		return Job{}, fmt.Errorf("%w: job request_id %.128q (%d bytes)", ErrMalformed, j.RequestID, len(j.RequestID))
	}
	if j.Deadline.IsZero() || j.EnqueueTime.IsZero() {
		return Job{}, fmt.Errorf("%w: job %s lacks enqueue_time or deadline", ErrMalformed, j.RequestID)
	}
	if j.Body != nil {
		var (
			req ChatRequest
			err error
		)
		switch j.Route {
		case RouteStream, RouteChat:
			// The api turned a /v1/stream body into a chat request
			// before it enqueued it: both are read as one.
			req, err = decodeChat(j.Body, hardLimits, j.Route, false, true)
		case RouteResponses:
			req, err = DecodeResponses(j.Body, hardLimits)
		case RouteEmbeddings, RouteCompletions:
			req, err = decodeWhole(j.Body, hardLimits, j.Route)
		default:
			return Job{}, fmt.Errorf("%w: job %s: route %.32q is not one this version serves", ErrMalformed, j.RequestID, j.Route)
		}
		if err != nil {
			return Job{}, fmt.Errorf("%w: job %s: %v", ErrMalformed, j.RequestID, err)
		}
		req.ThreadID = j.ThreadID
		j.Payload, j.Body = req, nil
	} else if err := validateMessages(j.Payload.Messages, maxMessagesHardLimit); err != nil {
		return Job{}, fmt.Errorf("%w: job %s: %v", ErrMalformed, j.RequestID, err)
	}
	if j.SessionID != "" && !ValidUserID(j.SessionID) {
		return Job{}, fmt.Errorf("%w: job %s: session_id %.128q is not 1 to 128 characters of A-Z a-z 0-9 . _ : @ -",
			ErrMalformed, j.RequestID, j.SessionID)
	}
	if j.Priority != "" {
		if _, err := ParsePriority(string(j.Priority)); err != nil {
			return Job{}, fmt.Errorf("%w: job %s: %v", ErrMalformed, j.RequestID, err)
		}
	}
	j.Trace, j.TraceDropped = normalizeTrace(j.Trace)
	return j, nil
}

// validIDChars reports whether s uses only the characters allowed in user
// and request identifiers: A-Z a-z 0-9 . _ : @ -
func validIDChars(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case c == '.', c == '_', c == ':', c == '@', c == '-':
		default:
			return false
		}
	}
	return true
}

// ValidUserID reports whether s is an acceptable X-User-ID (or
// X-Session-ID): 1 to 128 characters of A-Z a-z 0-9 . _ : @ -
func ValidUserID(s string) bool {
	return len(s) >= 1 && len(s) <= 128 && validIDChars(s)
}
