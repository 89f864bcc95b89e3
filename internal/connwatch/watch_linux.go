package connwatch

import (
	"errors"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/spillway-dev/spillway/internal/shrinkmap"
)

// poller is the process's one epoll instance for hang-ups, and the
// goroutine that waits on it. It lives as long as the process: it costs a
// file descriptor and a goroutine parked in epoll_wait, nothing while no
// connection hangs up.
type poller struct {
	fd int

	mu      sync.Mutex
	next    uint64 // keys are never reused, so a late event finds no watch
	watches shrinkmap.Map[uint64, *Watch]
	dead    bool // epoll_wait failed: new watches fall back to a read
}

var (
	pollerOnce sync.Once
	thePoller  *poller // nil when epoll is not available
)

func getPoller() *poller {
	pollerOnce.Do(func() {
		fd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
		if err != nil {
			return
		}
		thePoller = &poller{fd: fd}
		go thePoller.run()
	})
	return thePoller
}

// hangUps are the events that mean the peer is gone. EPOLLHUP and
// EPOLLERR are reported whether asked for or not; EPOLLONESHOT disarms
// the registration after its first event, so a half-closed connection
// that stays open does not wake the poller again and again.
const hangUps = unix.EPOLLRDHUP | unix.EPOLLONESHOT

// watchRaw registers rc's descriptor with the poller.
func watchRaw(rc syscall.RawConn) (*Watch, bool) {
	p := getPoller()
	if p == nil {
		return nil, false
	}
	w := &Watch{gone: make(chan struct{})}
	p.mu.Lock()
	if p.dead {
		p.mu.Unlock()
		return nil, false
	}
	p.next++
	key := p.next
	p.watches.Set(key, w)
	p.mu.Unlock()

	ev := unix.EpollEvent{Events: hangUps, Fd: int32(uint32(key)), Pad: int32(uint32(key >> 32))}
	var addErr error
	err := rc.Control(func(fd uintptr) {
		addErr = unix.EpollCtl(p.fd, unix.EPOLL_CTL_ADD, int(fd), &ev)
	})
	if err = errors.Join(err, addErr); err != nil {
		p.forget(key)
		return nil, false
	}
	w.stop = func() {
		if !p.forget(key) {
			return // the hang-up came first and disarmed the registration
		}
		// Under Control the descriptor cannot be closed and reused by
		// another connection. When the connection is closed already, so
		// is its registration: closing a descriptor removes it from
		// every epoll set.
		_ = rc.Control(func(fd uintptr) {
			_ = unix.EpollCtl(p.fd, unix.EPOLL_CTL_DEL, int(fd), nil)
		})
	}
	return w, true
}

// forget drops key's watch; false when it was gone already.
func (p *poller) forget(key uint64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, ok := p.watches.Get(key)
	p.watches.Delete(key)
	return ok
}

func (p *poller) run() {
	events := make([]unix.EpollEvent, 128)
	for {
		n, err := unix.EpollWait(p.fd, events, -1)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			// Not seen in practice: epoll_wait fails only for a bad
			// descriptor or buffer. Every watch still running would
			// never see its hang-up, so wake them all: each stream then
			// takes its client for gone, as it would on a failed write.
			p.failAll()
			return
		}
		for _, ev := range events[:n] {
			key := uint64(uint32(ev.Fd)) | uint64(uint32(ev.Pad))<<32
			p.mu.Lock()
			w, ok := p.watches.Get(key)
			p.watches.Delete(key)
			p.mu.Unlock()
			if ok {
				close(w.gone)
			}
		}
	}
}

func (p *poller) failAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.dead = true
	for _, w := range p.watches.All() {
		close(w.gone)
	}
	p.watches.Reset()
}
