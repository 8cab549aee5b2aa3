package bench

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/syncd-dev/syncd/internal/publish"
	"github.com/syncd-dev/syncd/internal/store"
)

// kvResult is the relay's cost of keeping the KV buckets of current state.
type kvResult struct {
	Events int `json:"events"`
	// ReconcileSeconds is what a relay's start costs once the buckets are
	// up to date: reading the mirror and every key, writing none; Keys is
	// how many keys it compared.
	ReconcileSeconds float64 `json:"reconcile_s"`
	Keys             int     `json:"keys"`
	RelayPerSec      float64 `json:"relay_per_s"`
	// RatioToPlain is RelayPerSec over the plain relay's rate on the same
	// outbox.
	RatioToPlain float64 `json:"ratio_to_plain_relay"`
	// PushP50ms and PushP99ms time a push from the move upstream to the
	// tag's new value reaching a watcher of the bucket.
	PushP50ms float64 `json:"push_to_kv_p50_ms"`
	PushP99ms float64 `json:"push_to_kv_p99_ms"`
}

// benchKV is the buckets of the benchmark.
func benchKV() publish.KVConfig {
	return publish.KVConfig{Tags: "bench_tags", Repos: "bench_repos", Advisories: "bench_advisories", History: 1}
}

// copyMirror copies the mirror at from to path with VACUUM INTO, outbox
// included, so that a second relay can be measured on the same events.
// (The store's reader pool is read-only, which VACUUM INTO refuses.)
func copyMirror(ctx context.Context, from, path string) error {
	db, err := sql.Open("sqlite", from)
	if err != nil {
		return fmt.Errorf("copy the mirror: %w", err)
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, `VACUUM INTO ?`, path); err != nil {
		return fmt.Errorf("copy the mirror: %w", err)
	}
	return nil
}

// measureRelayKV relays the outbox of the mirror copied at path, which
// holds the events plain relayed, to another stream with the KV buckets
// kept, then times the reconciliation of a relay's next start.
func measureRelayKV(
	ctx context.Context,
	conn *publish.Conn,
	path string,
	pcfg publish.Config,
	plain relayResult,
) (kvResult, error) {
	st, err := store.Open(ctx, path, store.Options{})
	if err != nil {
		return kvResult{}, err
	}
	defer st.Close()
	pcfg.Stream, pcfg.SubjectPrefix = "SYNCDKV", "syncdkv"
	if err := publish.EnsureStream(ctx, conn.JS, pcfg); err != nil {
		return kvResult{}, err
	}
	kv, err := publish.OpenKV(ctx, conn.JS, benchKV(), st)
	if err != nil {
		return kvResult{}, err
	}
	// Every resource has its created event in the outbox: this writes
	// nothing, and the relay writes every value.
	if _, err := kv.Reconcile(ctx); err != nil {
		return kvResult{}, err
	}
	var res kvResult
	n, _, err := st.UnpublishedCount(ctx)
	if err != nil {
		return kvResult{}, err
	}
	settle()
	relay := publish.NewRelay(conn.JS, st, pcfg, publish.WithKV(kv))
	start := time.Now()
	if err := relay.Flush(ctx); err != nil {
		return kvResult{}, fmt.Errorf("relay with KV: %w", err)
	}
	res.Events = n
	res.RelayPerSec = float64(n) / time.Since(start).Seconds()
	res.RatioToPlain = res.RelayPerSec / plain.RelayPerSec

	start = time.Now()
	rs, err := kv.Reconcile(ctx)
	if err != nil {
		return kvResult{}, err
	}
	if rs.Put+rs.Deleted != 0 {
		return kvResult{}, fmt.Errorf(
			"the relay left the buckets behind the mirror: reconciling put %d and deleted %d keys",
			rs.Put,
			rs.Deleted,
		)
	}
	res.ReconcileSeconds, res.Keys = time.Since(start).Seconds(), rs.Unchanged
	return res, nil
}

// kvUpdate is a tag's value as a watcher received it, and when.
type kvUpdate struct {
	publish.TagValue
	at time.Time
}

// watchTags sends every tag value written to the benchmark's tags bucket,
// from now on, to the returned channel, until ctx is done.
func watchTags(ctx context.Context, js jetstream.JetStream) (<-chan kvUpdate, error) {
	kv, err := js.KeyValue(ctx, benchKV().Tags)
	if err != nil {
		return nil, err
	}
	w, err := kv.WatchAll(ctx, jetstream.UpdatesOnly())
	if err != nil {
		return nil, err
	}
	out := make(chan kvUpdate, 64)
	go func() {
		defer w.Stop()
		for {
			select {
			case e := <-w.Updates():
				at := time.Now()
				var v kvUpdate
				if e == nil || e.Operation() != jetstream.KeyValuePut || json.Unmarshal(e.Value(), &v.TagValue) != nil {
					continue
				}
				v.at = at
				select {
				case out <- v:
				case <-ctx.Done():
					return
				}
			case <-ctx.Done():
				return
			}
		}
	}()
	return out, nil
}

// quantileMs is the p quantile of lat in milliseconds (0 when empty).
func quantileMs(lat []time.Duration, p float64) float64 {
	if len(lat) == 0 {
		return 0
	}
	s := slices.Clone(lat)
	slices.Sort(s)
	return float64(s[min(len(s)-1, int(p*float64(len(s))))].Microseconds()) / 1000
}

// BenchmarkRelayKV is the KV row of BenchmarkSyncd alone, on the
// realistic events of the benchmark's organization: a mirror syncs it
// (one created event per repo, tag and advisory in its outbox), and then,
// b.N times, two copies of that mirror are relayed, one plain and one
// keeping KV buckets, each to a stream (and buckets) of its own, which
// goes first alternating. BENCH_KVPROFILE: CPU profiles of the last two
// relays (the plain one's name ends in .plain).
//
//	BENCH_SCALE=0.3 go test -run '^$' -bench '^BenchmarkRelayKV$' -benchtime 4x ./bench/
func BenchmarkRelayKV(b *testing.B) {
	p, dir := setUp(b)
	ctx := context.Background()
	o := startOrg(orgScale(p.Scale))
	defer o.Close()
	l, conn, pcfg := syncedMirror(ctx, b, o, p, dir)
	n, _, err := l.store.UnpublishedCount(ctx)
	if err != nil {
		b.Fatal(err)
	}
	var times, cpus [2]time.Duration
	for i := range b.N {
		for j := range 2 {
			side := (i + j) % 2 // 0 plain, 1 with the buckets
			name := fmt.Sprintf("%s%d", []string{"plain", "kv"}[side], i)
			profile := ""
			if path := os.Getenv("BENCH_KVPROFILE"); path != "" && i == b.N-1 {
				profile = path + []string{".plain", ""}[side]
			}
			wall, cpu, err := relayCopy(ctx, conn, l, pcfg, filepath.Join(dir, name+".db"), name, side == 1, profile)
			if err != nil {
				b.Fatalf("relay %s: %v", name, err)
			}
			times[side] += wall
			cpus[side] += cpu
		}
	}
	events := n * b.N
	rate := func(s int) float64 { return float64(events) / times[s].Seconds() }
	cpu := func(s int) float64 { return float64(cpus[s].Microseconds()) / float64(events) }
	fmt.Fprintf(os.Stderr,
		"relay KV: %d events; plain %.0f events/s (%.1f µs CPU each), with KV %.0f/s (%.1f µs); ratio %.3f\n",
		events, rate(0), cpu(0), rate(1), cpu(1), rate(1)/rate(0))
	b.ReportMetric(rate(1)/rate(0), "kv/plain")
}

// relayCopy relays a copy of l's mirror, made at path, to a stream named
// after name (and, withKV, keeping buckets named after it too), and
// returns the time and the process's CPU the relay took; profile, when
// set, is where a CPU profile of it goes.
func relayCopy(
	ctx context.Context,
	conn *publish.Conn,
	l *mirror,
	pcfg publish.Config,
	path, name string,
	withKV bool,
	profile string,
) (wall, cpu time.Duration, err error) {
	if err := copyMirror(ctx, l.path, path); err != nil {
		return 0, 0, err
	}
	st, err := store.Open(ctx, path, store.Options{})
	if err != nil {
		return 0, 0, err
	}
	defer st.Close()
	pcfg.Stream, pcfg.SubjectPrefix = strings.ToUpper(name), name
	if err := publish.EnsureStream(ctx, conn.JS, pcfg); err != nil {
		return 0, 0, err
	}
	var opts []publish.RelayOption
	if withKV {
		kc := benchKV()
		kc.Tags, kc.Repos, kc.Advisories = kc.Tags+name, kc.Repos+name, kc.Advisories+name
		kv, err := publish.OpenKV(ctx, conn.JS, kc, st)
		if err != nil {
			return 0, 0, err
		}
		if _, err := kv.Reconcile(ctx); err != nil {
			return 0, 0, err
		}
		opts = append(opts, publish.WithKV(kv))
	}
	stop, err := startProfile(profile)
	if err != nil {
		return 0, 0, err
	}
	defer stop()
	settle()
	start, used := time.Now(), selfCPU()
	err = publish.NewRelay(conn.JS, st, pcfg, opts...).Flush(ctx)
	return time.Since(start), selfCPU() - used, err
}
