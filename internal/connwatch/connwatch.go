// Package connwatch tells when the client of a connection nobody reads
// from has gone, without a goroutine per connection where the system
// allows it.
//
// net/http notices a client that closes its connection by keeping a
// goroutine blocked in a read for as long as a handler runs. A stream
// that waits minutes in the queue holds that goroutine, and its stack,
// the whole time (docs/bench-history/2026-11.md, "Waiting streams"). Once a handler
// owns the connection (http.Hijacker), it can ask this package instead:
// on Linux one goroutine per process waits in epoll for every watched
// connection's hang-up; elsewhere, and for a connection without a file
// descriptor, Watch falls back to a goroutine per connection blocked in a
// one-byte read, as net/http does.
package connwatch

import (
	"net"
	"sync"
	"syscall"
	"time"
)

// Watch follows one connection until its peer hangs up or Stop is
// called.
type Watch struct {
	gone chan struct{}
	stop func()
	once sync.Once
}

// Gone is closed when the peer closed or reset the connection. A peer that
// only shut its sending side counts as gone, as it does for net/http.
func (w *Watch) Gone() <-chan struct{} { return w.gone }

// Stop ends the watch; Gone is then never closed by it. Call Stop before
// closing the connection. Safe to call more than once and concurrently
// with a hang-up.
func (w *Watch) Stop() { w.once.Do(w.stop) }

// Start watches c, whose reads are the caller's to give up: nothing may
// read from c while the watch runs, and a byte the peer sends is taken as
// a sign that it is still there, not data (a client of a server-sent event
// stream sends nothing after its request).
func Start(c net.Conn) *Watch {
	if rc := rawConn(c); rc != nil {
		if w, ok := watchRaw(rc); ok {
			return w
		}
	}
	return watchByRead(c)
}

// rawConn finds c's file descriptor through the wrappers that expose
// what they wrap (NetConn, as crypto/tls does); nil when there is none.
func rawConn(c net.Conn) syscall.RawConn {
	for c != nil {
		if sc, ok := c.(syscall.Conn); ok {
			rc, err := sc.SyscallConn()
			if err != nil {
				return nil
			}
			return rc
		}
		u, ok := c.(interface{ NetConn() net.Conn })
		if !ok {
			return nil
		}
		c = u.NetConn()
	}
	return nil
}

// aLongTimeAgo is a deadline that has passed: it makes a blocked read
// return at once (net/http uses the same trick).
var aLongTimeAgo = time.Unix(1, 0)

// watchByRead is the fallback: a goroutine blocked in a read, which
// returns when the peer hangs up or when Stop sets a deadline in the
// past.
func watchByRead(c net.Conn) *Watch {
	w := &Watch{gone: make(chan struct{})}
	stopped := make(chan struct{})
	done := make(chan struct{})
	w.stop = func() {
		close(stopped)
		_ = c.SetReadDeadline(aLongTimeAgo)
		<-done
	}
	go func() {
		defer close(done)
		var b [1]byte
		for {
			_, err := c.Read(b[:])
			select {
			case <-stopped:
				return
			default:
			}
			if err != nil {
				close(w.gone)
				return
			}
		}
	}()
	return w
}
