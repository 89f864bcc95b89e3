package connwatch

import (
	"net"
	"testing"
	"time"
)

// within is how long a hang-up may take to be seen: loopback delivers it
// in microseconds, so this only bounds a broken watch.
const within = 5 * time.Second

// pair returns both ends of a loopback TCP connection: the server's,
// which is watched, and the client's.
func pair(tb testing.TB) (server, client net.Conn) {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c
	}()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		tb.Fatal(err)
	}
	server, ok := <-accepted
	if !ok {
		tb.Fatal("accept failed")
	}
	tb.Cleanup(func() { server.Close(); client.Close() })
	return server, client
}

func waitGone(tb testing.TB, w *Watch) {
	tb.Helper()
	select {
	case <-w.Gone():
	case <-time.After(within):
		tb.Fatalf("hang-up not seen within %v", within)
	}
}

// wrapped hides the *net.TCPConn behind NetConn, as crypto/tls and the
// api's connection limiter do.
type wrapped struct{ net.Conn }

func (w wrapped) NetConn() net.Conn { return w.Conn }

// opaque hides the descriptor altogether: only the read fallback works.
type opaque struct{ net.Conn }

// bothWays watches a connection through its descriptor (the poller, on
// Linux) and through the read fallback.
var bothWays = []func(net.Conn) net.Conn{
	func(c net.Conn) net.Conn { return c },
	func(c net.Conn) net.Conn { return opaque{c} },
}

func TestGoneWhenPeerHangsUp(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		wrap func(net.Conn) net.Conn
		hang func(net.Conn) error
	}{
		{"close", func(c net.Conn) net.Conn { return c }, net.Conn.Close},
		{"half close", func(c net.Conn) net.Conn { return c }, func(c net.Conn) error { return c.(*net.TCPConn).CloseWrite() }},
		{"reset", func(c net.Conn) net.Conn { return c }, func(c net.Conn) error {
			_ = c.(*net.TCPConn).SetLinger(0)
			return c.Close()
		}},
		{"wrapped", func(c net.Conn) net.Conn { return wrapped{c} }, net.Conn.Close},
		{"read fallback", func(c net.Conn) net.Conn { return opaque{c} }, net.Conn.Close},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			server, client := pair(t)
			w := Start(tc.wrap(server))
			defer w.Stop()
			select {
			case <-w.Gone():
				t.Fatal("gone before the peer hung up")
			default:
			}
			if err := tc.hang(client); err != nil {
				t.Fatal(err)
			}
			waitGone(t, w)
		})
	}
}

// A byte from the client is not a hang-up: the watch goes on until the
// client really leaves.
func TestBytesAreNotAHangUp(t *testing.T) {
	t.Parallel()
	for _, wrap := range bothWays {
		server, client := pair(t)
		w := Start(wrap(server))
		if _, err := client.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
		// A second watch, started after the byte was sent and hung up at
		// once, is seen; the first must not be gone by then.
		s2, c2 := pair(t)
		w2 := Start(wrap(s2))
		c2.Close()
		waitGone(t, w2)
		select {
		case <-w.Gone():
			t.Fatal("a byte from the client was taken for a hang-up")
		default:
		}
		client.Close()
		waitGone(t, w)
		w.Stop()
		w2.Stop()
	}
}

// After Stop the watch says nothing, and leaves the connection usable for
// writes.
func TestStop(t *testing.T) {
	t.Parallel()
	for _, wrap := range bothWays {
		server, client := pair(t)
		w := Start(wrap(server))
		w.Stop()
		w.Stop() // twice is fine
		if _, err := server.Write([]byte("still here")); err != nil {
			t.Fatalf("write after Stop: %v", err)
		}
		buf := make([]byte, 10)
		if _, err := client.Read(buf); err != nil || string(buf) != "still here" {
			t.Fatalf("client read %q, %v", buf, err)
		}
		client.Close()
		s2, c2 := pair(t)
		w2 := Start(wrap(s2))
		c2.Close()
		waitGone(t, w2)
		w2.Stop()
		select {
		case <-w.Gone():
			t.Fatal("a stopped watch reported a hang-up")
		default:
		}
	}
}

// Stop after the connection was closed (the order a careless caller
// might use) does not block or fail.
func TestStopAfterClose(t *testing.T) {
	t.Parallel()
	server, _ := pair(t)
	w := Start(server)
	server.Close()
	w.Stop()
}

// Many watches hang up together, each is seen once.
func TestManyHangUps(t *testing.T) {
	t.Parallel()
	const n = 300
	watches := make([]*Watch, n)
	clients := make([]net.Conn, n)
	for i := range n {
		s, c := pair(t)
		watches[i], clients[i] = Start(s), c
	}
	for _, c := range clients {
		c.Close()
	}
	for _, w := range watches {
		waitGone(t, w)
		w.Stop()
	}
}
