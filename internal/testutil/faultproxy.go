package testutil

import (
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// FaultProxy is a TCP proxy on a loopback port in front of one address,
// which a test can make fail on demand: Cut, BlackHole, Stall, Latency,
// Heal. It stands between a syncd replica and a NATS server, or between
// two NATS nodes' cluster routes, so that a test can partition them without
// stopping any process.
//
// It is home-made rather than Toxiproxy used as a library: the module
// proxy offers Toxiproxy v2.5.0 at the newest (2022), which would add
// gorilla/mux, zerolog, tomb.v1 and urfave/cli to go.mod for a test; its
// proxies need an API server value to exist; and its black hole (the
// timeout toxic) closes the connections when it is removed anyway, which
// is what Heal does here. The semantics needed fit in this file.
type FaultProxy struct {
	ln net.Listener
	// target is where connections go; "" while not known yet (SetTarget).
	target atomic.Pointer[string]
	mode   atomic.Int32 // a faultMode
	delay  atomic.Int64 // added to each chunk, each way, in nanoseconds
	mu     sync.Mutex
	links  map[*proxyLink]struct{}
	closed bool
	// stalled is open while the proxy reads nothing (Stall); Heal and
	// Close close it.
	stalled chan struct{}
	wg      sync.WaitGroup
}

type faultMode int32

const (
	modePass faultMode = iota
	// modeCut: connections are closed, new ones closed once accepted.
	modeCut
	// modeBlackHole: connections stay open, bytes are dropped both ways,
	// no FIN or RST crosses; new ones are accepted and never answered.
	modeBlackHole
)

// proxyLink is one client connection and its upstream connection (nil
// when accepted in a black hole).
type proxyLink struct {
	client, server net.Conn
	// lost: bytes were dropped, so the protocol on it cannot be resumed;
	// Heal closes it.
	lost      atomic.Bool
	closeOnce sync.Once
	done      chan struct{} // closed by close
}

func (l *proxyLink) close() {
	l.closeOnce.Do(func() {
		close(l.done)
		l.client.Close()
		if l.server != nil {
			l.server.Close()
		}
	})
}

// NewFaultProxy listens on a loopback port the system picks and forwards
// every connection to target until the test ends. An empty target is not
// known yet: connections are closed once accepted until SetTarget.
func NewFaultProxy(tb testing.TB, target string) *FaultProxy {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	p := &FaultProxy{ln: ln, links: map[*proxyLink]struct{}{}}
	p.SetTarget(target)
	p.wg.Add(1)
	go p.accept()
	tb.Cleanup(p.Close)
	return p
}

// SetTarget sends the connections accepted from now on to target.
func (p *FaultProxy) SetTarget(target string) { p.target.Store(&target) }

// Addr is the proxy's host:port, where clients connect.
func (p *FaultProxy) Addr() string { return p.ln.Addr().String() }

// Cut closes every connection and closes each new one once accepted, as a
// host that went away and came back refusing would.
func (p *FaultProxy) Cut() {
	p.mode.Store(int32(modeCut))
	p.closeLinks(func(*proxyLink) bool { return true })
}

// BlackHole keeps every connection open and drops what either side sends
// from now on, closing nothing: each side learns of it only by its own
// timeouts. New connections are accepted and never get a byte.
func (p *FaultProxy) BlackHole() { p.mode.Store(int32(modeBlackHole)) }

// Stall keeps every connection open and stops reading from either side
// (but for a read already waiting, which takes one more chunk), dropping
// nothing: once the kernel's buffers are full, each side's writes block,
// as they do on a real network that drops every packet (the sender
// retransmits and its send buffer fills). Heal resumes them where they
// stopped.
func (p *FaultProxy) Stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stalled == nil && !p.closed {
		p.stalled = make(chan struct{})
	}
}

// waitStalled returns once the proxy is not stalled, or l is closed (Cut,
// Close).
func (p *FaultProxy) waitStalled(l *proxyLink) {
	p.mu.Lock()
	ch := p.stalled
	p.mu.Unlock()
	if ch != nil {
		select {
		case <-ch:
		case <-l.done:
		}
	}
}

// resume ends a stall.
func (p *FaultProxy) resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stalled != nil {
		close(p.stalled)
		p.stalled = nil
	}
}

// Latency delays every chunk of bytes by d in each direction (a round
// trip gains 2·d), keeping their order; 0 removes it.
func (p *FaultProxy) Latency(d time.Duration) { p.delay.Store(int64(d)) }

// Heal forwards again without delay. Connections that lost bytes in a
// black hole are closed: the protocol on them cannot resume mid-stream, so
// their ends reconnect, as they would after a real partition once their
// keepalives gave up.
func (p *FaultProxy) Heal() {
	p.delay.Store(0)
	p.mode.Store(int32(modePass))
	p.resume()
	p.closeLinks(func(l *proxyLink) bool { return l.lost.Load() })
}

// Conns is the number of connections open through the proxy.
func (p *FaultProxy) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.links)
}

// Close stops the proxy and closes its connections.
func (p *FaultProxy) Close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.resume()
	p.ln.Close()
	p.closeLinks(func(*proxyLink) bool { return true })
	p.wg.Wait()
}

func (p *FaultProxy) closeLinks(which func(*proxyLink) bool) {
	p.mu.Lock()
	var doomed []*proxyLink
	for l := range p.links {
		if which(l) {
			doomed = append(doomed, l)
		}
	}
	p.mu.Unlock()
	for _, l := range doomed {
		l.close()
	}
}

func (p *FaultProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		l := &proxyLink{client: c, done: make(chan struct{})}
		switch faultMode(p.mode.Load()) {
		case modeCut:
			c.Close()
			continue
		case modeBlackHole:
			l.lost.Store(true) // never reaches the target: closed at Heal
		default:
			target := *p.target.Load()
			if target == "" {
				c.Close()
				continue
			}
			s, err := net.DialTimeout("tcp", target, 2*time.Second)
			if err != nil {
				c.Close()
				continue
			}
			l.server = s
		}
		if !p.add(l) {
			l.close()
			return
		}
		p.wg.Add(1)
		go p.serve(l)
	}
}

// add registers a link unless the proxy is closed.
func (p *FaultProxy) add(l *proxyLink) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.links[l] = struct{}{}
	return true
}

func (p *FaultProxy) serve(l *proxyLink) {
	defer p.wg.Done()
	var wg sync.WaitGroup
	if l.server == nil {
		drain(l.client)
	} else {
		wg.Add(2)
		go func() { defer wg.Done(); p.pipe(l, l.client, l.server) }()
		go func() { defer wg.Done(); p.pipe(l, l.server, l.client) }()
		wg.Wait()
	}
	l.close()
	p.mu.Lock()
	delete(p.links, l)
	p.mu.Unlock()
}

// drain reads and drops everything a black-holed connection sends until
// it is closed (by its end or by Heal).
func drain(c net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		if _, err := c.Read(buf); err != nil {
			return
		}
	}
}

// chunk is bytes read from one side, due at the other at a time.
type chunk struct {
	data []byte
	due  time.Time
}

// pipe copies src to dst through a queue, so that latency delays each
// chunk without slowing the reads behind it. In a black hole it drops what
// it reads; a side that closes then does not close the other (no FIN
// crosses a black hole): Heal does.
func (p *FaultProxy) pipe(l *proxyLink, src, dst net.Conn) {
	queue := make(chan chunk, 256)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ch := range queue {
			if d := time.Until(ch.due); d > 0 {
				time.Sleep(d)
			}
			if faultMode(p.mode.Load()) == modeBlackHole {
				l.lost.Store(true)
				continue
			}
			if _, err := dst.Write(ch.data); err != nil {
				l.close()
				for range queue {
					// the reader stops at its next read of the closed side
				}
				return
			}
		}
	}()
	buf := make([]byte, 32<<10)
	for {
		p.waitStalled(l)
		n, err := src.Read(buf)
		if n > 0 {
			if faultMode(p.mode.Load()) == modeBlackHole {
				l.lost.Store(true)
			} else {
				queue <- chunk{data: append([]byte(nil), buf[:n]...), due: time.Now().Add(time.Duration(p.delay.Load()))}
			}
		}
		if err != nil {
			close(queue)
			<-done
			if !errors.Is(err, net.ErrClosed) && faultMode(p.mode.Load()) == modeBlackHole {
				l.lost.Store(true)
				return // the other side stays open until Heal
			}
			l.close()
			return
		}
	}
}
