package platformsim

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"
)

// DeliveryFaults perturbs event delivery the ways an at-least-once,
// unordered channel may: each rate is a probability per event.
type DeliveryFaults struct {
	DuplicateRate float64 `json:"duplicateRate"` // deliver the event twice, same Ce-Id
	ReorderRate   float64 `json:"reorderRate"`   // hold the event back so later ones overtake it
	DropRate      float64 `json:"dropRate"`      // never deliver the event
	// ReorderDelay is how long a reordered event is held (default 200ms).
	ReorderDelay time.Duration `json:"reorderDelay"`
}

// DeliveryRecord is the outcome of one event addressed to one sink.
type DeliveryRecord struct {
	ID         string `json:"id"`
	Type       string `json:"type"`
	Subject    string `json:"subject"`
	Sink       string `json:"sink"`
	Attempts   int    `json:"attempts"`
	LastStatus int    `json:"lastStatus"` // 0 when the last attempt got no answer
	Delivered  bool   `json:"delivered"`
	Dropped    bool   `json:"dropped"` // by the DropRate fault
	Duplicate  bool   `json:"duplicate"`
}

type pending struct {
	ev        event
	attempt   int
	notBefore time.Time
	rec       *DeliveryRecord // its entry in the delivery log
	duplicate bool
}

// delivery is the sink-delivery queue: one worker, started on the first
// event and stopped by Close, sends events in order of readiness.
type delivery struct {
	mu      sync.Mutex
	queue   []*pending
	records []*DeliveryRecord
	faults  DeliveryFaults
	rng     *rand.Rand
	notify  chan struct{}
	started bool
	closed  bool
	cancel  context.CancelFunc
	done    chan struct{}
}

// maxRecords bounds the delivery log of a long-running demo.
const maxRecords = 10000

// SetDeliveryFaults changes the faults applied to events emitted from now on.
func (s *Sim) SetDeliveryFaults(f DeliveryFaults) {
	s.events.mu.Lock()
	s.events.faults = f
	s.events.mu.Unlock()
}

// Deliveries returns the log of event deliveries, oldest first (the most
// recent 10,000).
func (s *Sim) Deliveries() []DeliveryRecord {
	s.events.mu.Lock()
	defer s.events.mu.Unlock()
	out := make([]DeliveryRecord, len(s.events.records))
	for i, r := range s.events.records {
		out[i] = *r
	}
	return out
}

// Close stops event delivery; events not yet delivered are abandoned. The
// simulator's data and handler keep working.
func (s *Sim) Close() {
	d := &s.events
	d.mu.Lock()
	d.closed = true
	cancel, done := d.cancel, d.done
	d.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
}

// enqueueLocked hands an event to the delivery queue, applying the
// delivery faults. Callers hold s.mu, which orders events as changes.
func (s *Sim) enqueueLocked(ev event) {
	d := &s.events
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return
	}
	if d.rng == nil {
		d.rng = rand.New(rand.NewPCG(uint64(s.opts.Seed), 0xde11))
		d.notify = make(chan struct{}, 1)
	}
	f := d.faults
	now := time.Now()
	rec := func(dup bool) *DeliveryRecord {
		if len(d.records) >= maxRecords {
			d.records = append(d.records[:0], d.records[len(d.records)-maxRecords/2:]...)
		}
		r := &DeliveryRecord{ID: ev.id, Type: ev.typ, Subject: ev.subject, Sink: ev.sink, Duplicate: dup}
		d.records = append(d.records, r)
		return r
	}
	if f.DropRate > 0 && d.rng.Float64() < f.DropRate {
		rec(false).Dropped = true
		return
	}
	p := &pending{ev: ev, notBefore: now, rec: rec(false)}
	if f.ReorderRate > 0 && d.rng.Float64() < f.ReorderRate {
		delay := f.ReorderDelay
		if delay <= 0 {
			delay = 200 * time.Millisecond
		}
		p.notBefore = now.Add(delay)
	}
	d.queue = append(d.queue, p)
	if f.DuplicateRate > 0 && d.rng.Float64() < f.DuplicateRate {
		d.queue = append(d.queue, &pending{ev: ev, notBefore: p.notBefore, rec: rec(true), duplicate: true})
	}
	if !d.started {
		d.started = true
		ctx, cancel := context.WithCancel(context.Background())
		d.cancel, d.done = cancel, make(chan struct{})
		go s.deliverLoop(ctx)
	}
	select {
	case d.notify <- struct{}{}:
	default:
	}
}

// next takes the first ready event, or reports how long to wait.
func (d *delivery) next(now time.Time) (*pending, time.Duration) {
	d.mu.Lock()
	defer d.mu.Unlock()
	wait := time.Duration(-1)
	for i, p := range d.queue {
		if !p.notBefore.After(now) {
			d.queue = append(d.queue[:i], d.queue[i+1:]...)
			return p, 0
		}
		if w := p.notBefore.Sub(now); wait < 0 || w < wait {
			wait = w
		}
	}
	return nil, wait
}

func (s *Sim) deliverLoop(ctx context.Context) {
	d := &s.events
	defer close(d.done)
	for {
		p, wait := d.next(time.Now())
		if p == nil {
			var timer <-chan time.Time
			var t *time.Timer
			if wait >= 0 {
				t = time.NewTimer(wait)
				timer = t.C
			}
			select {
			case <-ctx.Done():
				return
			case <-d.notify:
			case <-timer:
			}
			if t != nil {
				t.Stop()
			}
			continue
		}
		status := s.send(ctx, p.ev)
		d.mu.Lock()
		p.attempt++
		p.rec.Attempts, p.rec.LastStatus = p.attempt, status
		p.rec.Delivered = status >= 200 && status < 300
		// Non-2xx answers and transport failures are retried with
		// exponential backoff, up to DeliveryAttempts.
		if (status < 200 || status >= 300) && p.attempt < s.opts.DeliveryAttempts && ctx.Err() == nil {
			backoff := s.opts.DeliveryBackoff << (p.attempt - 1)
			if backoff > s.opts.DeliveryMaxBackoff || backoff <= 0 {
				backoff = s.opts.DeliveryMaxBackoff
			}
			p.notBefore = time.Now().Add(backoff)
			d.queue = append(d.queue, p)
		}
		d.mu.Unlock()
	}
}

// send posts one event in CloudEvents binary mode and returns the HTTP
// status (0 on a transport error).
func (s *Sim) send(ctx context.Context, ev event) int {
	sum := sha256.Sum256(ev.body)
	now := s.now()
	tok, err := s.signJWT(map[string]any{
		"iss":     s.baseURL(),
		"aud":     s.eventAudience(),
		"sub":     "webhook:" + ev.group,
		"iat":     now.Unix(),
		"nbf":     now.Add(-time.Minute).Unix(),
		"exp":     now.Add(10 * time.Minute).Unix(),
		"jti":     ev.id,
		"webhook": map[string]string{"digest": "sha256:" + hex.EncodeToString(sum[:])},
	})
	if err != nil {
		return 0
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, ev.sink, bytes.NewReader(ev.body))
	if err != nil {
		return 0
	}
	h := req.Header
	h.Set("Content-Type", "application/json")
	h.Set("Authorization", "Bearer "+tok)
	h.Set("Ce-Specversion", "1.0")
	h.Set("Ce-Id", ev.id)
	h.Set("Ce-Type", ev.typ)
	h.Set("Ce-Source", s.baseURL())
	h.Set("Ce-Subject", ev.subject)
	h.Set("Ce-Time", fmtMs(ev.timeMs))
	h.Set("Ce-Group", ev.group)
	h.Set("Ce-Audience", s.eventAudience())
	resp, err := s.opts.DeliveryClient.Do(req)
	if err != nil {
		return 0
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	_ = resp.Body.Close()
	return resp.StatusCode
}

func (s *Sim) eventAudience() string {
	if s.opts.EventAudience != "" {
		return s.opts.EventAudience
	}
	return "customer"
}
