package stream

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/spillway-dev/spillway/internal/openaiwire"
	"github.com/spillway-dev/spillway/internal/protocol"
)

// OpenAI serves the OpenAI-compatible endpoints, POST /v1/chat/completions
// and the credentials of GET /v1/models (docs/API.md, "OpenAI-compatible
// API"), through the Handler's steps: the same identity, admission, pool,
// path choice, queue and overload as /v1/stream; only the request body
// and the output format differ. The Handler's Drain and Wait cover its
// streams.
type OpenAI struct {
	h *Handler
	d openaiDialect
}

// NewOpenAI returns the OpenAI-compatible endpoints of h. The first of
// models is the model named in answers to requests that name none.
func NewOpenAI(h *Handler, models []string) *OpenAI {
	d := openaiDialect{}
	if len(models) > 0 {
		d.defaultModel = models[0]
	}
	return &OpenAI{h: h, d: d}
}

// ChatCompletions serves POST /v1/chat/completions.
func (o *OpenAI) ChatCompletions(w http.ResponseWriter, r *http.Request) { o.h.serve(w, r, o.d) }

// Responses serves POST /v1/responses, OpenAI's Responses API: the same
// admission, pool, queue and overload as chat completions; the upstream's
// events (streamed) or its response object (not) relayed as they came.
func (o *OpenAI) Responses(w http.ResponseWriter, r *http.Request) {
	o.h.serve(w, r, responsesDialect{})
}

// Embeddings serves POST /v1/embeddings and Completions POST
// /v1/completions: whole-answer calls, the body forwarded as sent and the
// upstream's JSON answer written as it came, with the same admission,
// pool, queue and overload as chat completions.
func (o *OpenAI) Embeddings(w http.ResponseWriter, r *http.Request) {
	o.h.serve(w, r, wholeDialect{protocol.DecodeEmbeddings})
}

// Completions: see Embeddings.
func (o *OpenAI) Completions(w http.ResponseWriter, r *http.Request) {
	o.h.serve(w, r, wholeDialect{protocol.DecodeCompletions})
}

// wholeDialect reads a whole-answer route's request and writes the
// upstream's one raw chunk as the 200 application/json answer.
type wholeDialect struct {
	decodeFn func([]byte, protocol.Limits) (protocol.ChatRequest, error)
}

func (d wholeDialect) decode(body []byte, lim protocol.Limits) (protocol.ChatRequest, opener, error) {
	req, err := d.decodeFn(body, lim)
	if err != nil {
		return protocol.ChatRequest{}, nil, err
	}
	if !req.WholeAnswer() {
		// A streamed legacy completion: its chunks relayed as they came,
		// the upstream's ids kept (they are not chat completions'), then
		// [DONE].
		return req, func(w http.ResponseWriter, writeTimeout time.Duration) sink {
			return &chatChunks{sseAnswer: sseAnswer{sw: newWriter(w, writeTimeout)}, model: req.Model, keepIDs: true}
		}, nil
	}
	return req, func(w http.ResponseWriter, writeTimeout time.Duration) sink {
		return &wholeAnswer{w: w, rc: http.NewResponseController(w), writeTimeout: writeTimeout, model: req.Model, whole: true}
	}, nil
}

// resumable is false, as for chat completions.
func (wholeDialect) resumable() bool { return false }

func (wholeDialect) refuse(w http.ResponseWriter, p *protocol.Problem, _ string) {
	writeOpenAIError(w, p)
}

// responsesDialect reads a Responses API request and relays the
// upstream's events, or the response object of the last one.
type responsesDialect struct{}

func (responsesDialect) decode(body []byte, lim protocol.Limits) (protocol.ChatRequest, opener, error) {
	req, err := protocol.DecodeResponses(body, lim)
	if err != nil {
		return protocol.ChatRequest{}, nil, err
	}
	if req.Stream {
		return req, func(w http.ResponseWriter, writeTimeout time.Duration) sink {
			return &responsesEvents{sseAnswer{sw: newWriter(w, writeTimeout)}}
		}, nil
	}
	return req, func(w http.ResponseWriter, writeTimeout time.Duration) sink {
		return &wholeAnswer{w: w, rc: http.NewResponseController(w), writeTimeout: writeTimeout, model: req.Model, responses: true}
	}, nil
}

// resumable is false, as for chat completions.
func (responsesDialect) resumable() bool { return false }

func (responsesDialect) refuse(w http.ResponseWriter, p *protocol.Problem, _ string) {
	writeOpenAIError(w, p)
}

// Guard serves next (GET /v1/models, /v1/models/{id}) to the callers the
// other endpoints take, as OpenAI asks for the same credentials there, and
// refuses the others in OpenAI's error shape.
func (o *OpenAI) Guard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, p := o.h.identity(r); p != nil {
			o.d.refuse(w, p, r.URL.Path)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// openaiDialect reads OpenAI's chat completion request and answers with
// chat.completion.chunk events or one chat.completion object.
type openaiDialect struct {
	defaultModel string
}

func (d openaiDialect) decode(body []byte, lim protocol.Limits) (protocol.ChatRequest, opener, error) {
	req, err := openaiwire.DecodeRequest(body, lim)
	if err != nil {
		return protocol.ChatRequest{}, nil, err
	}
	model := req.Chat.Model
	if model == "" {
		model = d.defaultModel
	}
	if req.Stream {
		return req.Chat, func(w http.ResponseWriter, writeTimeout time.Duration) sink {
			return &chatChunks{sseAnswer: sseAnswer{sw: newWriter(w, writeTimeout)}, model: model, includeUsage: req.IncludeUsage}
		}, nil
	}
	return req.Chat, func(w http.ResponseWriter, writeTimeout time.Duration) sink {
		return &wholeAnswer{w: w, rc: http.NewResponseController(w), writeTimeout: writeTimeout, model: model}
	}, nil
}

// resumable is false: OpenAI's chunks carry no SSE ids to resume from,
// so these streams are not logged and end when their client leaves.
func (openaiDialect) resumable() bool { return false }

func (openaiDialect) refuse(w http.ResponseWriter, p *protocol.Problem, _ string) {
	writeOpenAIError(w, p)
}

// writeOpenAIError answers p in OpenAI's error shape, with the problem's
// status and Retry-After, so SDKs raise their usual errors (a 429 is a
// rate-limit error) and honour the delay.
func writeOpenAIError(w http.ResponseWriter, p *protocol.Problem) {
	b := openAIError(w.Header(), p)
	w.WriteHeader(p.Status)
	_, _ = w.Write(b)
}

// openAIError sets h for p's OpenAI error response and returns its body:
// the upstream's own error body, as it sent it, when the upstream refused
// the request (docs/API.md, "Upstream client errors are the client's").
func openAIError(h http.Header, p *protocol.Problem) []byte {
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	if p.RetryAfterSeconds > 0 {
		h.Set("Retry-After", strconv.Itoa(p.RetryAfterSeconds))
	}
	if p.UpstreamError != nil {
		return append(append([]byte(nil), p.UpstreamError...), '\n')
	}
	b, _ := json.Marshal(openaiwire.ErrorBody{Error: openaiwire.ErrorOf(p)}) // strings only
	return append(b, '\n')
}

// answerRestarted ends a streamed answer whose worker was replaced after
// chunks were sent: OpenAI's format cannot void them, and joining the new
// attempt to them would mix two answers.
func answerRestarted() *protocol.Problem {
	return protocol.Problems[protocol.ProblemWorkerLost].New(
		"The worker answering the request stopped after part of the answer was sent, and the answer restarted elsewhere; retry the request.")
}

// sseAnswer is what the streamed OpenAI answers share (chatChunks,
// responsesEvents): SSE framing, flushes and write deadlines through
// their Writer, and the 200 and the headers held back until the first
// thing is written, so a failure before it is still an HTTP error with
// the problem's status and Retry-After, as a refusal would be.
type sseAnswer struct {
	sw        Writer
	requestID string
	path      string
	started   bool // the 200 was sent
	// sentContent: something of the answer was sent, so a restart can no
	// longer be hidden.
	sentContent bool
}

func (a *sseAnswer) start(requestID, path string) error {
	a.requestID, a.path = requestID, path
	h := a.sw.header()
	setRequestID(h, requestID)
	h.Set("X-Stream-Path", path)
	return nil
}

// chunk hands the upstream's chunk on as it came: the dialect's event
// relays it (its raw JSON is the answer's wire form).
func (a *sseAnswer) chunk(s *session, c protocol.Chunk) error {
	return s.emit(Event{Content: c.Content, Raw: c.Raw})
}

// begin sends the 200 with the SSE headers, once.
func (a *sseAnswer) begin() error {
	if a.started {
		return nil
	}
	a.started = true
	return a.sw.Start(a.requestID, a.path)
}

// frame opens the answer and returns the writer's buffer, to which the
// caller appends one event and hands it to put: an event is built where
// it goes out from rather than copied there, one copy of every chunk
// fewer.
func (a *sseAnswer) frame() ([]byte, error) {
	if err := a.begin(); err != nil {
		return nil, err
	}
	if a.sw.terminal {
		return nil, ErrTerminated
	}
	return a.sw.buf, nil
}

// put sends b, the buffer frame returned with one more event appended,
// unless the writer holds it.
func (a *sseAnswer) put(b []byte, terminal bool) error {
	a.sw.buf = b
	return a.sw.commit(terminal)
}

// write writes the event that add appends.
func (a *sseAnswer) write(add func([]byte) []byte, terminal bool) error {
	b, err := a.frame()
	if err != nil {
		return err
	}
	return a.put(add(b), terminal)
}

// done notes the path of an answer that ends before it started: a direct
// request handed to the queue was answered by a worker (docs/API.md,
// "Hand-off to the queue").
func (a *sseAnswer) done(d protocol.Done) {
	if !a.started {
		a.path = d.Path
	}
}

// failEarly answers p as an HTTP error when nothing was sent yet, and
// reports whether it did; after that the dialect ends its stream with an
// error event of its own.
func (a *sseAnswer) failEarly(p *protocol.Problem) (bool, error) {
	if a.started {
		return false, nil
	}
	a.started = true
	if a.sw.conn != nil {
		// The connection was taken over while the answer waited: the
		// writer sends the whole error response itself.
		return true, a.sw.respond(p.Status, openAIError(a.sw.header(), p))
	}
	a.sw.terminal = true
	writeOpenAIError(a.sw.w, p)
	return true, nil
}

// restart is a reset's answer: nothing while nothing of the answer was
// sent (the new attempt continues seamlessly); after that the stream
// ends with line, an error (docs/API.md).
func (a *sseAnswer) restart(line func([]byte, *protocol.Problem) []byte) error {
	if !a.sentContent {
		return nil
	}
	p := answerRestarted()
	if err := a.write(func(b []byte) []byte { return line(b, p) }, true); err != nil {
		return err
	}
	return errAnswerEnded
}

// fail ends a started answer with line, an error event.
func (a *sseAnswer) fail(line func([]byte, *protocol.Problem) []byte, p *protocol.Problem) error {
	if ok, err := a.failEarly(p); ok {
		return err
	}
	return a.write(func(b []byte) []byte { return line(b, p) }, true)
}

func (a *sseAnswer) ping() error {
	b, err := a.frame()
	if err != nil {
		return err
	}
	return a.put(append(b, protocol.PingFrame...), false)
}

// gather and send put the chunks ready at the same moment into one write
// (Writer.Hold).
func (a *sseAnswer) gather() { a.sw.Hold() }

func (a *sseAnswer) send() error { return a.sw.Flush() }

func (a *sseAnswer) sse() *Writer { return &a.sw }

// chatChunks writes a streamed chat completion: chat.completion.chunk
// events, then `data: [DONE]`; a streamed legacy completion the same way,
// with the upstream's ids kept.
type chatChunks struct {
	sseAnswer
	enc          *openaiwire.ChunkEncoder
	id           []byte // the answer's id as a JSON string, for raw chunks
	model        string
	includeUsage bool
	// raw: the answer's chunks are the upstream's (relayed, with their
	// own finish and usage chunks), not made from plain content.
	raw bool
	// keepIDs: the chunks keep the upstream's ids (a streamed legacy
	// completion's).
	keepIDs bool
}

func (c *chatChunks) start(requestID, path string) error {
	c.enc = openaiwire.NewChunkEncoder(requestID, c.model, time.Now().Unix())
	c.id = protocol.AppendJSONString(nil, openaiwire.CompletionID(requestID))
	return c.sseAnswer.start(requestID, path)
}

func (c *chatChunks) event(e Event) error {
	switch e.Name {
	case "":
		return c.relay(e.Content, e.Raw)
	case protocol.EventReset:
		return c.restart(openaiwire.AppendErrorEvent)
	case protocol.EventDone:
		return c.finish(*e.Done)
	case protocol.EventError:
		return c.fail(openaiwire.AppendErrorEvent, e.Problem)
	}
	// A queued position and a retry have no form in OpenAI's format: the
	// retry's answer follows on the same stream as if it were the first.
	return nil
}

// relay relays an upstream chunk as it came, with only its id made ours
// (stable across a takeover); a usage chunk only when the client asked
// for one. Plain content (a provider without chunks of its own) is
// written as a chunk of ours.
func (c *chatChunks) relay(content string, raw []byte) error {
	if raw != nil {
		c.raw = true
		// A chunk with content is never the usage chunk.
		if !c.includeUsage && content == "" && usageOnly(raw) {
			return nil
		}
	}
	if _, err := c.frame(); err != nil {
		return err
	}
	// Room for the chunks gathered into one write, as /v1/stream's.
	c.sw.chunkRoom(len(raw) + len(c.id) + 2*len(content) + 256)
	b := c.sw.buf
	switch {
	case raw == nil:
		b = c.enc.AppendContent(b, content, !c.sentContent)
		c.sentContent = true
	case c.keepIDs:
		b = append(append(append(b, "data: "...), raw...), "\n\n"...)
	default:
		b = openaiwire.AppendChunkEvent(b, raw, c.id)
	}
	if raw != nil && !c.sentContent && (content != "" || !openaiwire.IsPreamble(raw)) {
		c.sentContent = true
	}
	return c.put(b, false)
}

// usageOnly reports a chunk of usage and no choices.
func usageOnly(raw []byte) bool {
	return (bytes.Contains(raw, []byte(`"choices":[]`)) || bytes.Contains(raw, []byte(`"choices": []`))) &&
		openaiwire.IsUsageChunk(raw)
}

func (c *chatChunks) finish(d protocol.Done) error {
	c.done(d)
	b, err := c.frame()
	if err != nil {
		return err
	}
	if c.raw {
		// The upstream's finish and usage chunks went out as they came.
		return c.put(append(b, openaiwire.DoneFrame...), true)
	}
	if !c.sentContent {
		// The first delta carries the role, even of an empty answer.
		b = c.enc.AppendContent(b, "", true)
	}
	b = c.enc.AppendFinish(b, d.FinishReason)
	if c.includeUsage && d.Usage != nil {
		b = c.enc.AppendUsage(b, *d.Usage)
	}
	b = append(b, openaiwire.DoneFrame...)
	return c.put(b, true)
}

// responsesEvents writes a streamed Responses API answer: the upstream's
// events relayed as they came, each under its type's SSE event name, with
// no [DONE] after them (POST /v1/responses).
type responsesEvents struct{ sseAnswer }

func (c *responsesEvents) event(e Event) error {
	switch e.Name {
	case "":
		return c.relay(e.Raw)
	case protocol.EventReset:
		return c.restart(responsesError)
	case protocol.EventDone:
		// The upstream's response.completed went out as it came.
		c.done(*e.Done)
		b, err := c.frame()
		if err != nil {
			return err
		}
		return c.put(b, true)
	case protocol.EventError:
		return c.fail(responsesError, e.Problem)
	}
	// A queued position and a retry have no form in the Responses API.
	return nil
}

// relay relays one Responses API event as it came: its ids are the
// upstream's, which a later previous_response_id names.
func (c *responsesEvents) relay(raw []byte) error {
	var typ string
	if raw == nil || json.Unmarshal(protocol.MemberValue(raw, "type"), &typ) != nil || typ == "" {
		return nil
	}
	if typ != "response.created" && typ != "response.in_progress" {
		c.sentContent = true
	}
	b, err := c.frame()
	if err != nil {
		return err
	}
	b = append(b, "event: "...)
	b = append(b, typ...)
	b = append(b, "\ndata: "...)
	b = append(b, raw...)
	return c.put(append(b, "\n\n"...), false)
}

// responsesError appends the Responses API's error event, which ends a
// stream that failed after it started.
func responsesError(dst []byte, p *protocol.Problem) []byte {
	e := openaiwire.ErrorOf(p)
	b, _ := json.Marshal(struct {
		Type    string  `json:"type"`
		Code    string  `json:"code"`
		Message string  `json:"message"`
		Param   *string `json:"param"`
	}{"error", e.Code, e.Message, nil}) // strings only
	out := append(dst, "event: error\ndata: "...)
	out = append(out, b...)
	return append(out, "\n\n"...)
}

// wholeAnswer collects an answer and writes it in one piece when it is
// done: the chat.completion object assembled from the chunks, the
// response object of the Responses API's last event, or a whole-answer
// route's one upstream answer as it came. Nothing is sent before, so a
// failure at any point is an HTTP error, and a restarted answer simply
// starts over.
type wholeAnswer struct {
	w            http.ResponseWriter
	rc           *http.ResponseController
	writeTimeout time.Duration
	model        string
	requestID    string
	created      int64
	asm          *openaiwire.Assembler
	ended        bool
	// responses: the answer is the response object of the Responses
	// API's last response.completed (or .incomplete) event.
	responses bool
	response  []byte
	// whole: the answer is the upstream's one raw chunk, written as it
	// came (POST /v1/embeddings, /v1/completions).
	whole bool
}

func (c *wholeAnswer) start(requestID, path string) error {
	c.requestID, c.created = requestID, time.Now().Unix()
	c.asm = openaiwire.NewAssembler(requestID, c.model, c.created)
	h := c.w.Header()
	setRequestID(h, requestID)
	h.Set("X-Stream-Path", path)
	return nil
}

func (c *wholeAnswer) chunk(s *session, ch protocol.Chunk) error {
	return s.emit(Event{Content: ch.Content, Raw: ch.Raw})
}

func (c *wholeAnswer) event(e Event) error {
	switch e.Name {
	case "":
		return c.collect(e.Content, e.Raw)
	case protocol.EventReset:
		c.asm.Reset()
		c.response = nil
		return nil
	case protocol.EventDone:
		return c.finish(*e.Done)
	case protocol.EventError:
		if c.ended {
			return ErrTerminated
		}
		c.ended = true
		writeOpenAIError(c.w, e.Problem)
		return nil
	}
	// A queued position and a retry send nothing: the retry's answer is
	// collected as the first.
	return nil
}

func (c *wholeAnswer) collect(content string, raw []byte) error {
	if c.ended {
		return ErrTerminated
	}
	switch {
	case c.whole:
		if raw != nil {
			c.response = append(c.response[:0], raw...)
		}
	case c.responses:
		var typ string
		if raw != nil && json.Unmarshal(protocol.MemberValue(raw, "type"), &typ) == nil &&
			(typ == "response.completed" || typ == "response.incomplete") {
			c.response = append(c.response[:0], protocol.MemberValue(raw, "response")...)
		}
	case raw != nil:
		c.asm.Chunk(raw)
	default:
		c.asm.Content(content)
	}
	return nil
}

func (c *wholeAnswer) finish(d protocol.Done) error {
	if c.ended {
		return ErrTerminated
	}
	c.ended = true
	c.asm.Finish(d.FinishReason, d.Usage)
	b := c.asm.Object()
	if c.responses || c.whole {
		if c.response == nil {
			writeOpenAIError(c.w, protocol.StreamFailed())
			return nil
		}
		b = c.response
	}
	c.w.Header().Set("Content-Type", "application/json")
	// A direct request handed to the queue was answered by a worker
	// (docs/API.md, "Hand-off to the queue").
	c.w.Header().Set("X-Stream-Path", d.Path)
	if c.writeTimeout > 0 {
		// As Writer: not every ResponseWriter supports deadlines.
		_ = c.rc.SetWriteDeadline(time.Now().Add(c.writeTimeout))
	}
	c.w.WriteHeader(http.StatusOK)
	if _, err := c.w.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("stream: write completion: %w", err)
	}
	return nil
}

// ping sends nothing: a byte sent would commit the status before the
// answer is known.
func (c *wholeAnswer) ping() error { return nil }

// gather and send have nothing to gather: the answer goes out at its end.
func (c *wholeAnswer) gather() {}

func (c *wholeAnswer) send() error { return nil }

// sse is nil: an answer written in one piece is not an SSE stream.
func (c *wholeAnswer) sse() *Writer { return nil }
