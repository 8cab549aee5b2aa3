package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/syncd-dev/syncd/internal/events"
	"github.com/syncd-dev/syncd/internal/publish"
	"github.com/syncd-dev/syncd/internal/store"
)

// publishConfig is syncd's default stream, on the embedded server.
func publishConfig(dir, source string) publish.Config {
	return publish.Config{
		DataDir:         dir,
		SubjectPrefix:   "syncd",
		Stream:          "SYNCD",
		DuplicateWindow: 2 * time.Minute,
		Source:          source,
	}
}

// relayResult compares the relay with a plain publish loop.
type relayResult struct {
	Events         int     `json:"events"`
	RelayPerSec    float64 `json:"relay_per_s"`
	CeilingPerSec  float64 `json:"jetstream_ceiling_per_s"`
	RatioToCeiling float64 `json:"ratio"`
}

// measureRelay publishes the outbox of st with the relay, and the same
// messages with a plain async publish loop before and after it.
func measureRelay(ctx context.Context, conn *publish.Conn, st *store.Store, pcfg publish.Config) (relayResult, error) {
	relay := publish.NewRelay(conn.JS, st, pcfg)
	// The loop's messages, kept between its runs in a form the garbage
	// collector need not walk: while the relay runs, the heap holds what
	// a relay's would, so that neither side pays for the other's data.
	type rawMsg struct {
		subject, id string
		data        []byte
	}
	var raws []rawMsg
	for after := int64(0); ; {
		evs, err := st.Unpublished(ctx, after, 5000)
		if err != nil {
			return relayResult{}, err
		}
		for _, e := range evs {
			m := relay.Message(e)
			raws = append(raws, rawMsg{subject: strings.TrimPrefix(m.Subject, pcfg.SubjectPrefix+"."), id: e.ID, data: m.Data})
			after = e.Seq
		}
		if len(evs) < 5000 {
			break
		}
	}
	if len(raws) == 0 {
		return relayResult{}, errors.New("relay: the outbox is empty; nothing to measure")
	}
	ceilingRun := func(stream, prefix string) (float64, error) {
		msgs := make([]*nats.Msg, len(raws))
		for i, r := range raws {
			msgs[i] = &nats.Msg{Subject: prefix + r.subject, Data: r.data,
				Header: nats.Header{"Content-Type": []string{publish.ContentType}, jetstream.MsgIDHeader: []string{r.id}}}
		}
		settle()
		return jetstreamCeiling(ctx, conn.JS, stream, msgs, publish.DefaultMaxInFlight)
	}
	// The loop runs before and after the relay, and the faster run is
	// the ceiling: the first run also pays for warming up the server.
	ceiling, err := ceilingRun("CEILING1", "ceiling.")
	if err != nil {
		return relayResult{}, err
	}
	settle()
	stopProfile, err := startProfile(os.Getenv("BENCH_RELAYPROFILE"))
	if err != nil {
		return relayResult{}, err
	}
	start := time.Now()
	err = relay.Flush(ctx)
	rate := float64(len(raws)) / time.Since(start).Seconds()
	stopProfile()
	if err != nil {
		return relayResult{}, fmt.Errorf("relay flush: %w", err)
	}
	again, err := ceilingRun("CEILING2", "ceiling2.")
	if err != nil {
		return relayResult{}, err
	}
	ceiling = max(ceiling, again)
	if n, _, err := st.UnpublishedCount(ctx); err != nil || n != 0 {
		return relayResult{}, fmt.Errorf("relay left %d events unpublished (%v)", n, err)
	}
	return relayResult{Events: len(raws), RelayPerSec: rate, CeilingPerSec: ceiling, RatioToCeiling: rate / ceiling}, nil
}

// pushResult is the latency from a move upstream to its event in JetStream.
type pushResult struct {
	Pushes int     `json:"pushes"`
	P50ms  float64 `json:"p50_ms"`
	P99ms  float64 `json:"p99_ms"`
	Maxms  float64 `json:"max_ms"`
	MaxAt  int     `json:"max_at"` // which push (from 0) was the slowest
	// FirstMs is a push made before the timed ones and not counted in
	// them: the first after start pays for fetching the issuer's keys and
	// for warming up connections and caches.
	FirstMs float64 `json:"first_ms"`
	// kv holds the same pushes timed to the tag's value in the KV bucket.
	kv []time.Duration
}

// measurePush wires the push path as syncd run does (a receiver on a
// loopback port, the subscription registered with the platform, the relay
// running) and moves n tags one at a time, timing each from the move to
// the tag.moved event reaching a JetStream consumer, after one push that is
// not timed with them.
//
// The relay keeps the benchmark's KV buckets, and each push is also timed
// to the tag's new value reaching a watcher of the tags bucket.
func measurePush(
	ctx context.Context,
	o *org,
	m *mirror,
	conn *publish.Conn,
	pcfg publish.Config,
	n int,
) (pushResult, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	kv, err := publish.OpenKV(ctx, conn.JS, benchKV(), m.store)
	if err != nil {
		return pushResult{}, err
	}
	relay := publish.NewRelay(conn.JS, m.store, pcfg, publish.WithKV(kv))
	if err := relay.Flush(ctx); err != nil {
		return pushResult{}, err
	}
	relayDone := make(chan error, 1)
	go func() { relayDone <- relay.Run(ctx) }()
	defer func() { cancel(); <-relayDone }()

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return pushResult{}, err
	}
	rcv := events.NewReceiver(
		events.Config{Issuer: o.URL(), Groups: []string{"org1"}, TypePrefix: "dev.chainguard."},
		m.crawler,
		m.store,
	)
	srv := &http.Server{Handler: rcv, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	defer srv.Close()
	rcvDone := make(chan error, 1)
	go func() { rcvDone <- rcv.Run(ctx) }()
	defer func() { cancel(); <-rcvDone }()
	reg := &events.Registrar{
		Client: m.client,
		Store:  m.store,
		Groups: []string{"org1"},
		Sink:   "http://" + ln.Addr().String() + "/events",
	}
	if err := reg.Ensure(ctx); err != nil {
		return pushResult{}, err
	}

	type moved struct {
		Subject string `json:"subject"`
		Data    struct {
			After struct{ Digest string } `json:"after"`
		} `json:"data"`
	}
	got := make(chan moved, 64)
	cons, err := conn.JS.OrderedConsumer(ctx, pcfg.Stream, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{pcfg.SubjectPrefix + ".tag.moved.>"}, DeliverPolicy: jetstream.DeliverNewPolicy})
	if err != nil {
		return pushResult{}, err
	}
	cc, err := cons.Consume(func(msg jetstream.Msg) {
		var ev moved
		if json.Unmarshal(msg.Data(), &ev) == nil {
			select {
			case got <- ev:
			case <-ctx.Done():
			}
		}
	})
	if err != nil {
		return pushResult{}, err
	}
	defer cc.Stop()

	values, err := watchTags(ctx, conn.JS)
	if err != nil {
		return pushResult{}, err
	}
	tags := o.sim.Truth().Tags
	lat := make([]time.Duration, 0, n+1)
	kvLat := make([]time.Duration, 0, n+1)
	for i := range n + 1 {
		// Spread the moves over the organization, one tag each.
		tag := tags[(i*7919)%len(tags)]
		d := fmt.Sprintf("sha256:%064x", 0xb00+i)
		start := time.Now()
		if err := o.sim.MoveTag(tag.UID, d); err != nil {
			return pushResult{}, err
		}
		timeout := time.NewTimer(10 * time.Second)
	wait:
		for {
			select {
			case ev := <-got:
				if ev.Subject == tag.UID && ev.Data.After.Digest == d {
					break wait
				}
			case <-timeout.C:
				return pushResult{}, fmt.Errorf(
					"push %d: no tag.moved event for %s within 10s (receiver stats: accepted %d, failed %d)",
					i, tag.UID, rcv.Stats.Accepted.Load(), rcv.Stats.Failed.Load())
			}
		}
		lat = append(lat, time.Since(start))
	waitKV:
		for {
			select {
			case v := <-values:
				if v.UID == tag.UID && v.Digest == d {
					kvLat = append(kvLat, v.at.Sub(start))
					break waitKV
				}
			case <-timeout.C:
				return pushResult{}, fmt.Errorf("push %d: %s's value in the KV bucket did not change within 10s", i, tag.UID)
			}
		}
		timeout.Stop()
	}
	first := lat[0]
	lat = lat[1:]
	maxAt := 0
	for i, d := range lat {
		if d > lat[maxAt] {
			maxAt = i
		}
	}
	slices.Sort(lat)
	q := func(p float64) float64 {
		return float64(lat[min(len(lat)-1, int(p*float64(len(lat))))].Microseconds()) / 1000
	}
	return pushResult{
		Pushes:  n,
		P50ms:   q(0.50),
		P99ms:   q(0.99),
		Maxms:   q(1),
		MaxAt:   maxAt,
		FirstMs: float64(first.Microseconds()) / 1000,
		kv:      kvLat[1:],
	}, nil
}
