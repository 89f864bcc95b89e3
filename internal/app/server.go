package app

import (
	"container/list"
	"encoding/json"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/stream"
)

// Limits on hostile clients (docs/OPERATIONS.md, "Isolation").
const (
	// maxHeaderBytes is the header block a request may send; a larger one
	// gets a 431 problem document.
	maxHeaderBytes = 64 << 10
	// serverMaxHeaderBytes is where net/http itself stops reading and
	// answers a bare 431: twice ours, so everything between gets the
	// problem document and no client can make the server buffer more.
	serverMaxHeaderBytes = 2 * maxHeaderBytes
	// refuseTimeout bounds answering one connection over MAX_CONNECTIONS.
	refuseTimeout = time.Second
	// maxRefusing bounds the connections being answered 503 at once; past
	// it an excess connection is closed without an answer, so a flood
	// cannot make the refusals themselves unbounded.
	maxRefusing = 64
	// closeSlack is how long, after the grace, the streams ended with a
	// shutting-down event get to write it before every connection closes.
	closeSlack = 2 * time.Second
)

// limitListener caps the open connections at max. At the cap an idle
// keep-alive connection is closed to make room, the longest idle first
// (tracked through http.Server.ConnState, connState); only when none is
// idle is one more accepted, answered with a minimal 503 problem and
// closed, rather than left in the kernel's backlog where the client would
// hang until its own timeout (golang.org/x/net/netutil.LimitListener's
// behaviour). Closing an idle connection races a request its client may
// be sending on it just then, as the server's own idle timeout does; HTTP
// clients retry a request on a reused connection that closed unanswered.
type limitListener struct {
	net.Listener
	max      int64
	open     atomic.Int64
	refusing atomic.Int64
	refused  sync.WaitGroup

	mu   sync.Mutex
	idle list.List // *limitedConn waiting for a next request, longest idle first
}

func newLimitListener(ln net.Listener, maxConns int) *limitListener {
	return &limitListener{Listener: ln, max: int64(maxConns)}
}

// Accept returns the next connection under the cap; it answers the ones
// over it itself.
func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.admit() {
			return &limitedConn{Conn: c, release: func() { l.open.Add(-1) }}, nil
		}
		if l.refusing.Add(1) > maxRefusing {
			l.refusing.Add(-1)
			_ = c.Close()
			continue
		}
		l.refused.Go(func() {
			defer l.refusing.Add(-1)
			refuseConn(c)
		})
	}
}

// admit counts one more connection in if it fits under the cap, closing
// idle ones to make it fit.
func (l *limitListener) admit() bool {
	for {
		if l.open.Add(1) <= l.max {
			return true
		}
		l.open.Add(-1)
		if !l.closeIdle() {
			return false
		}
	}
}

// closeIdle closes the longest idle connection, which gives its place
// back; false when none is idle.
func (l *limitListener) closeIdle() bool {
	l.mu.Lock()
	e := l.idle.Front()
	if e == nil {
		l.mu.Unlock()
		return false
	}
	c := l.idle.Remove(e).(*limitedConn)
	c.idle = nil
	l.mu.Unlock()
	_ = c.Close()
	return true
}

// connState is the server's ConnState hook: it keeps the list of idle
// connections, the ones closeIdle may take.
func (l *limitListener) connState(nc net.Conn, state http.ConnState) {
	c, ok := nc.(*limitedConn)
	if !ok {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if state == http.StateIdle {
		if c.idle == nil {
			c.idle = l.idle.PushBack(c)
		}
		return
	}
	if c.idle != nil {
		l.idle.Remove(c.idle)
		c.idle = nil
	}
}

// Close closes the listener and waits for the refusals under way, which
// are bounded by refuseTimeout.
func (l *limitListener) Close() error {
	err := l.Listener.Close()
	l.refused.Wait()
	return err
}

// tooManyConnections is the whole response to a connection over the cap.
var tooManyConnections = func() []byte {
	p := protocol.TooManyConnections(1)
	body, _ := json.Marshal(p) // strings and ints cannot fail
	return []byte("HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/problem+json\r\n" +
		"Cache-Control: no-store\r\nRetry-After: 1\r\nConnection: close\r\nContent-Length: " +
		strconv.Itoa(len(body)+1) + "\r\n\r\n" + string(body) + "\n")
}()

func refuseConn(c net.Conn) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(refuseTimeout))
	// Read what the client sent first: closing with unread data resets
	// the connection, and the client would lose the answer.
	buf := make([]byte, 4096)
	_, _ = c.Read(buf)
	_, _ = c.Write(tooManyConnections)
	if tc, ok := c.(interface{ CloseWrite() error }); ok {
		_ = tc.CloseWrite()
	}
}

// limitedConn gives its slot back once, however often it is closed.
type limitedConn struct {
	net.Conn
	once    sync.Once
	release func()
	idle    *list.Element // in limitListener.idle while idle; under its mu
}

func (c *limitedConn) Close() error {
	c.once.Do(c.release)
	return c.Conn.Close()
}

// NetConn returns the connection under the limit, as tls.Conn does: a
// stream that took its connection over watches it for a hang-up through
// the descriptor (connwatch).
func (c *limitedConn) NetConn() net.Conn { return c.Conn }

// headerSize is the size of r's header block as sent, near enough: the
// request line and every field line.
func headerSize(r *http.Request) int {
	n := len(r.Method) + len(r.RequestURI) + len(r.Proto) + 4
	for k, vs := range r.Header {
		for _, v := range vs {
			n += len(k) + len(v) + 4
		}
	}
	return n
}

// drainer tracks the requests on the stream routes so a shutdown knows
// when none is left, and refuses new ones once it began.
type drainer struct {
	mu       sync.Mutex
	open     int
	draining bool
	idle     chan struct{} // closed when draining and open is 0
}

func newDrainer() *drainer { return &drainer{idle: make(chan struct{})} }

// enter counts a request in; false once draining, when it must be refused.
func (d *drainer) enter() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.draining {
		return false
	}
	d.open++
	return true
}

func (d *drainer) leave() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.open--
	if d.draining && d.open == 0 {
		close(d.idle)
	}
}

// hold counts a stream whose handler returned while it goes on (a parked
// stream, stream.Deps.Hold) as open, as its request was, until release.
func (d *drainer) hold() (release func()) {
	d.mu.Lock()
	d.open++
	d.mu.Unlock()
	var once sync.Once
	return func() { once.Do(d.leave) }
}

// begin starts the drain and returns a channel closed when no request is
// left.
func (d *drainer) begin() <-chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.draining {
		d.draining = true
		if d.open == 0 {
			close(d.idle)
		}
	}
	return d.idle
}

// isDraining reports whether a drain began.
func (d *drainer) isDraining() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.draining
}

// limitHeaders refuses a header block over maxHeaderBytes with a 431
// problem document (net/http's own 431, past serverMaxHeaderBytes, is
// plain text).
func limitHeaders(c *gin.Context) {
	if headerSize(c.Request) > maxHeaderBytes {
		c.Header("Connection", "close")
		stream.WriteProblem(c.Writer, protocol.HeadersTooLarge(maxHeaderBytes), c.Request.URL.Path)
		c.Abort()
	}
}

// guard wraps a stream route: during a drain a new request is refused
// with shutting-down.
func (d *drainer) guard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !d.enter() {
			// Another api process takes the retry at once.
			w.Header().Set("Connection", "close")
			stream.WriteProblem(w, protocol.ShuttingDown(1), r.URL.Path)
			return
		}
		defer d.leave()
		next.ServeHTTP(w, r)
	})
}
