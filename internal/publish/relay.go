package publish

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/syncd-dev/syncd/internal/store"
)

// Outbox is what the relay needs of the store.
type Outbox interface {
	Unpublished(ctx context.Context, after int64, limit int) ([]store.Event, error)
	MarkPublished(ctx context.Context, seqs []int64) error
	Notify() <-chan struct{}
}

// Relay publishes the outbox to JetStream.
type Relay struct {
	js          jetstream.JetStream
	outbox      Outbox
	prefix      string
	source      string
	log         *slog.Logger
	batch       int
	maxInFlight int
	// OnPublished, when set, is called for every acknowledged event.
	OnPublished func(store.Event)
}

// NewRelay returns a relay from outbox to js.
func NewRelay(js jetstream.JetStream, outbox Outbox, cfg Config) *Relay {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Relay{js: js, outbox: outbox, prefix: cfg.SubjectPrefix, source: cfg.Source, log: log, batch: 2048, maxInFlight: 512}
}

// CloudEvent is an event in CloudEvents 1.0 structured JSON mode.
type CloudEvent struct {
	SpecVersion     string          `json:"specversion"`
	ID              string          `json:"id"`
	Source          string          `json:"source"`
	Type            string          `json:"type"`
	Subject         string          `json:"subject,omitempty"`
	Time            string          `json:"time,omitempty"`
	DataContentType string          `json:"datacontenttype"`
	Data            json.RawMessage `json:"data"`
}

// TypePrefix begins every CloudEvents type syncd emits: dev.syncd.tag.moved.
const TypePrefix = "dev.syncd."

// ContentType is the message content type of the CloudEvents NATS binding's
// structured mode.
const ContentType = "application/cloudevents+json"

// Message encodes e as the JetStream message the relay publishes.
func (r *Relay) Message(e store.Event) (*nats.Msg, error) {
	body, err := json.Marshal(CloudEvent{
		SpecVersion: "1.0", ID: e.ID, Source: r.source, Type: TypePrefix + e.Type, Subject: e.Subject,
		Time: store.FormatTime(e.Time), DataContentType: "application/json", Data: e.Data,
	})
	if err != nil {
		return nil, err
	}
	m := nats.NewMsg(Subject(r.prefix, e.Resource, e.Action, e.Scope))
	m.Data = body
	m.Header.Set("Content-Type", ContentType)
	m.Header.Set(jetstream.MsgIDHeader, e.ID)
	return m, nil
}

// Run relays until ctx is done: it drains the outbox, then waits for the
// store to commit new events (or a minute, whichever is first). Failures
// back off and try again; nothing is marked published before JetStream
// acknowledged it.
func (r *Relay) Run(ctx context.Context) error {
	b := backoff.NewExponentialBackOff(backoff.WithInitialInterval(200*time.Millisecond), backoff.WithMaxInterval(10*time.Second), backoff.WithMaxElapsedTime(0))
	for {
		n, err := r.drain(ctx)
		if ctx.Err() != nil {
			return nil
		}
		wait := time.Minute
		if err != nil {
			wait = b.NextBackOff()
			r.log.Warn("publishing events failed; will retry", "err", err, "retry_in", wait.Round(time.Millisecond))
		} else {
			b.Reset()
			if n > 0 {
				continue
			}
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-r.outbox.Notify():
			if err != nil {
				// A commit does not cure a broken connection: wait out the backoff.
				select {
				case <-ctx.Done():
				case <-t.C:
				}
			}
			t.Stop()
		case <-t.C:
		}
	}
}

// Flush publishes until the outbox is empty or an error stops it.
func (r *Relay) Flush(ctx context.Context) error {
	for {
		n, err := r.drain(ctx)
		if err != nil || n == 0 {
			return err
		}
	}
}

// drain publishes the outbox batch by batch and returns how many events it
// published.
func (r *Relay) drain(ctx context.Context) (int, error) {
	total := 0
	for {
		evs, err := r.outbox.Unpublished(ctx, 0, r.batch)
		if err != nil || len(evs) == 0 {
			return total, err
		}
		acked, err := r.publishBatch(ctx, evs)
		if merr := r.outbox.MarkPublished(context.WithoutCancel(ctx), acked); merr != nil {
			return total, errors.Join(err, merr)
		}
		total += len(acked)
		if err != nil {
			return total, err
		}
	}
}

// publishBatch publishes evs asynchronously with a bounded number in flight.
// Events of one resource go one at a time, each after the previous one's
// acknowledgement, so that a failed publish can never let a later event of
// the same resource into the stream ahead of it; different resources go in
// parallel. It returns the seqs JetStream acknowledged (duplicates count).
func (r *Relay) publishBatch(ctx context.Context, evs []store.Event) ([]int64, error) {
	var order []string
	queues := make(map[string][]store.Event)
	for _, e := range evs {
		if _, ok := queues[e.Subject]; !ok {
			order = append(order, e.Subject)
		}
		queues[e.Subject] = append(queues[e.Subject], e)
	}
	var (
		mu       sync.Mutex
		acked    = make([]int64, 0, len(evs))
		firstErr error
		wg       sync.WaitGroup
		slots    = make(chan struct{}, r.maxInFlight)
	)
	fail := func(err error) {
		mu.Lock()
		if firstErr == nil {
			firstErr = err
		}
		mu.Unlock()
	}
	for _, key := range order {
		q := queues[key]
		wg.Go(func() {
			for _, e := range q {
				if err := r.publishOne(ctx, e, slots); err != nil {
					fail(err)
					return
				}
				mu.Lock()
				acked = append(acked, e.Seq)
				mu.Unlock()
				if r.OnPublished != nil {
					r.OnPublished(e)
				}
			}
		})
	}
	wg.Wait()
	return acked, firstErr
}

func (r *Relay) publishOne(ctx context.Context, e store.Event, slots chan struct{}) error {
	m, err := r.Message(e)
	if err != nil {
		return err
	}
	select {
	case slots <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-slots }()
	fut, err := r.js.PublishMsgAsync(m)
	if err != nil {
		return fmt.Errorf("publish %s %s: %w", e.Type, e.ID, err)
	}
	select {
	case <-fut.Ok():
		r.log.Info("published event", "type", e.Type, "subject", m.Subject, "id", e.ID)
		return nil
	case err := <-fut.Err():
		return fmt.Errorf("publish %s %s: %w", e.Type, e.ID, err)
	case <-ctx.Done():
		return ctx.Err()
	}
}
