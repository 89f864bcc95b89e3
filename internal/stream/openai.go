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
		return req, func(w http.ResponseWriter, writeTimeout time.Duration) Sink {
			return eventSink{&openaiChunks{sw: NewWriter(w, writeTimeout), w: w, model: req.Model, keepIDs: true}}
		}, nil
	}
	return req, func(w http.ResponseWriter, writeTimeout time.Duration) Sink {
		return eventSink{&openaiCompletion{w: w, rc: http.NewResponseController(w), writeTimeout: writeTimeout, model: req.Model, whole: true}}
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
		return req, func(w http.ResponseWriter, writeTimeout time.Duration) Sink {
			return eventSink{&openaiChunks{sw: NewWriter(w, writeTimeout), w: w, model: req.Model, responses: true}}
		}, nil
	}
	return req, func(w http.ResponseWriter, writeTimeout time.Duration) Sink {
		return eventSink{&openaiCompletion{w: w, rc: http.NewResponseController(w), writeTimeout: writeTimeout, model: req.Model, responses: true}}
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
		return req.Chat, func(w http.ResponseWriter, writeTimeout time.Duration) Sink {
			return eventSink{&openaiChunks{sw: NewWriter(w, writeTimeout), w: w, model: model, includeUsage: req.IncludeUsage}}
		}, nil
	}
	return req.Chat, func(w http.ResponseWriter, writeTimeout time.Duration) Sink {
		return eventSink{&openaiCompletion{w: w, rc: http.NewResponseController(w), writeTimeout: writeTimeout, model: model}}
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

// openaiChunks writes a streamed answer: chat.completion.chunk events,
// then `data: [DONE]`. The 200 and the headers are held back until the
// first thing is written, so a failure before it is still an HTTP error
// with the problem's status and Retry-After, as a refusal would be.
type openaiChunks struct {
	sw           *Writer // SSE framing, flushes and write deadlines
	w            http.ResponseWriter
	enc          *openaiwire.ChunkEncoder
	id           []byte // the answer's id as a JSON string, for raw chunks
	buf          []byte
	model        string
	includeUsage bool
	requestID    string
	path         string
	started      bool // the 200 was sent
	sentContent  bool // a chunk with content was sent
	// raw: the answer's chunks are the upstream's (relayed, with their
	// own finish and usage chunks), not made from plain content.
	raw bool
	// keepIDs: the chunks keep the upstream's ids (a streamed legacy
	// completion's).
	keepIDs bool
	// responses: the answer is the Responses API's: its events are
	// relayed as they came, each under its type's SSE event name, with
	// no [DONE] after them (POST /v1/responses).
	responses bool
}

func (c *openaiChunks) Start(requestID, path string) error {
	c.requestID, c.path = requestID, path
	c.enc = openaiwire.NewChunkEncoder(requestID, c.model, time.Now().Unix())
	c.id = protocol.AppendJSONString(nil, openaiwire.CompletionID(requestID))
	h := c.w.Header()
	setRequestID(h, requestID)
	h.Set("X-Stream-Path", path)
	return nil
}

// begin sends the 200 with the SSE headers, once.
func (c *openaiChunks) begin() error {
	if c.started {
		return nil
	}
	c.started = true
	return c.sw.Start(c.requestID, c.path)
}

func (c *openaiChunks) write(b []byte, terminal bool) error {
	if err := c.begin(); err != nil {
		return err
	}
	c.buf = b[:0]
	return c.sw.write(b, terminal)
}

// Chunk relays an upstream chunk as it came, with only its id made ours
// (stable across a takeover); a usage chunk only when the client asked
// for one. Plain content (a provider without chunks of its own) is
// written as a chunk of ours.
func (c *openaiChunks) Chunk(_ int, content string, raw []byte) error {
	if c.responses {
		return c.responsesEvent(raw)
	}
	if raw == nil {
		b := c.enc.AppendContent(c.buf[:0], content, !c.sentContent)
		c.sentContent = true
		return c.write(b, false)
	}
	c.raw = true
	// A chunk with content is never the usage chunk.
	if !c.includeUsage && content == "" && usageOnly(raw) {
		return nil
	}
	if content != "" || !c.sentContent && !openaiwire.IsPreamble(raw) {
		c.sentContent = true
	}
	if c.keepIDs {
		b := append(append(c.buf[:0], "data: "...), raw...)
		return c.write(append(b, "\n\n"...), false)
	}
	return c.write(openaiwire.AppendChunkEvent(c.buf[:0], raw, c.id), false)
}

// responsesEvent relays one Responses API event as it came: its ids are
// the upstream's, which a later previous_response_id names.
func (c *openaiChunks) responsesEvent(raw []byte) error {
	var typ string
	if raw == nil || json.Unmarshal(protocol.MemberValue(raw, "type"), &typ) != nil || typ == "" {
		return nil
	}
	if typ != "response.created" && typ != "response.in_progress" {
		c.sentContent = true
	}
	b := append(c.buf[:0], "event: "...)
	b = append(b, typ...)
	b = append(b, "\ndata: "...)
	b = append(b, raw...)
	return c.write(append(b, "\n\n"...), false)
}

// errorLine is the line that ends a stream which failed after it started:
// `data: {"error":{…}}`, or the Responses API's error event.
func (c *openaiChunks) errorLine(p *protocol.Problem) []byte {
	if !c.responses {
		return openaiwire.AppendErrorEvent(c.buf[:0], p)
	}
	e := openaiwire.ErrorOf(p)
	b, _ := json.Marshal(struct {
		Type    string  `json:"type"`
		Code    string  `json:"code"`
		Message string  `json:"message"`
		Param   *string `json:"param"`
	}{"error", e.Code, e.Message, nil}) // strings only
	out := append(c.buf[:0], "event: error\ndata: "...)
	out = append(out, b...)
	return append(out, "\n\n"...)
}

// usageOnly reports a chunk of usage and no choices.
func usageOnly(raw []byte) bool {
	return (bytes.Contains(raw, []byte(`"choices":[]`)) || bytes.Contains(raw, []byte(`"choices": []`))) &&
		openaiwire.IsUsageChunk(raw)
}

// Reset continues seamlessly while nothing of the answer was sent; after
// that it ends the stream with an error (docs/API.md).
func (c *openaiChunks) Reset(protocol.Reset) error {
	if !c.sentContent {
		return nil
	}
	if err := c.write(c.errorLine(answerRestarted()), true); err != nil {
		return err
	}
	return errAnswerEnded
}

// Retrying sends nothing: OpenAI's format has no such event, and the
// retry's answer follows on the same stream as if it were the first.
func (c *openaiChunks) Retrying(protocol.Retrying) error { return nil }

func (c *openaiChunks) Done(d protocol.Done) error {
	if !c.started {
		// A direct request handed to the queue was answered by a worker
		// (docs/API.md, "Hand-off to the queue").
		c.path = d.Path
	}
	b := c.buf[:0]
	if c.responses {
		// The upstream's response.completed went out as it came.
		return c.write(b, true)
	}
	if c.raw {
		// The upstream's finish and usage chunks went out as they came.
		return c.write(append(b, openaiwire.DoneFrame...), true)
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
	return c.write(b, true)
}

func (c *openaiChunks) Error(p *protocol.Problem) error {
	if !c.started {
		c.started = true
		if c.sw.conn != nil {
			// The connection was taken over while the answer waited:
			// the writer sends the whole error response itself.
			return c.sw.respond(p.Status, openAIError(c.sw.header(), p))
		}
		c.sw.terminal = true
		writeOpenAIError(c.w, p)
		return nil
	}
	return c.write(c.errorLine(p), true)
}

// Hold and Flush gather the chunks ready at the same moment into one
// write (Writer.Hold).
func (c *openaiChunks) Hold() { c.sw.Hold() }

func (c *openaiChunks) Flush() error { return c.sw.Flush() }

func (c *openaiChunks) Ping() error {
	return c.write(append(c.buf[:0], protocol.PingFrame...), false)
}

// openaiCompletion collects an answer and writes it as one
// chat.completion object when it is done. Nothing is sent before, so a
// failure at any point is an HTTP error, and a restarted answer simply
// starts over.
type openaiCompletion struct {
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

func (c *openaiCompletion) Start(requestID, path string) error {
	c.requestID, c.created = requestID, time.Now().Unix()
	c.asm = openaiwire.NewAssembler(requestID, c.model, c.created)
	h := c.w.Header()
	setRequestID(h, requestID)
	h.Set("X-Stream-Path", path)
	return nil
}

func (c *openaiCompletion) Chunk(_ int, content string, raw []byte) error {
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

func (c *openaiCompletion) Reset(protocol.Reset) error {
	c.asm.Reset()
	c.response = nil
	return nil
}

// Retrying sends nothing: the retry's answer is collected as the first.
func (c *openaiCompletion) Retrying(protocol.Retrying) error { return nil }

// Ping sends nothing: a byte sent would commit the status before the
// answer is known.
func (c *openaiCompletion) Ping() error { return nil }

func (c *openaiCompletion) Done(d protocol.Done) error {
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

func (c *openaiCompletion) Error(p *protocol.Problem) error {
	if c.ended {
		return ErrTerminated
	}
	c.ended = true
	writeOpenAIError(c.w, p)
	return nil
}
