package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/syncd-dev/syncd/internal/platformsim"
	"github.com/syncd-dev/syncd/internal/publish"
	"github.com/syncd-dev/syncd/internal/testutil"
)

// kvHistory is every value each key of a KV bucket took, in the order a
// watcher (what "nats kv watch" is) saw them; nil for a delete.
type kvHistory struct {
	mu     sync.Mutex
	values map[string][][]byte
	// when is when each value was stored (rev@time), for the report.
	when map[string][]string
	seen int
}

// watchKV records the values of bucket until ctx is done.
func watchKV(ctx context.Context, t *testing.T, natsURL, bucket string) *kvHistory {
	t.Helper()
	h := &kvHistory{values: map[string][][]byte{}, when: map[string][]string{}}
	js := testutil.JetStream(t, natsURL, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	var kv jetstream.KeyValue
	testutil.WaitFor(t, 30*time.Second, "the KV bucket "+bucket, func() bool {
		var err error
		kv, err = js.KeyValue(ctx, bucket)
		return err == nil
	})
	w, err := kv.WatchAll(ctx)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		defer w.Stop()
		for e := range w.Updates() {
			if e == nil {
				continue // the initial values are in
			}
			h.mu.Lock()
			h.seen++
			var v []byte
			if e.Operation() == jetstream.KeyValuePut {
				v = e.Value()
			}
			h.values[e.Key()] = append(h.values[e.Key()], v)
			h.when[e.Key()] = append(
				h.when[e.Key()],
				fmt.Sprintf("rev %d at %s", e.Revision(), e.Created().Format("15:04:05.000")),
			)
			h.mu.Unlock()
		}
	}()
	return h
}

// tagRegressions checks the tags bucket's history against the stream:
// the digests a tag's key took must follow the states its events carry,
// in stream order, forward, never back to an earlier one (what a write
// sent late, after newer ones, would do). A value before the first of
// the tag's events is the baseline's. It returns one line per
// regression, and how many values it checked.
func (h *kvHistory) tagRegressions(rcv *received) ([]string, int) {
	rcv.mu.Lock()
	states := maps.Clone(rcv.tagStates)
	rcv.mu.Unlock()
	return h.regressions(func(uid string) []string { return states[uid] })
}

// truthRegressions checks the same against the simulator's history
// records, oldest first: the order of the upstream's changes.
func (h *kvHistory) truthRegressions(truth platformsim.Truth) ([]string, int) {
	return h.regressions(func(uid string) []string {
		var ds []string
		for _, r := range truth.History[uid] {
			ds = append(ds, r.Digest)
		}
		return ds
	})
}

// regressions checks every tag key's values against order(uid), the
// tag's states in the order they must be taken.
func (h *kvHistory) regressions(order func(uid string) []string) ([]string, int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	checked := 0
	for key, vals := range h.values {
		if publish.IsTermKey(key) {
			continue
		}
		prev := -1
		var trail []string
		for i, raw := range vals {
			if raw == nil {
				continue // no deletes in these scenarios; a delete is not an older state
			}
			var v publish.TagValue
			if err := json.Unmarshal(raw, &v); err != nil {
				out = append(out, fmt.Sprintf("%s: undecodable value %q", key, raw))
				continue
			}
			checked++
			states := order(v.UID)
			at := -1
			for j := max(prev, 0); j < len(states); j++ {
				if states[j] == v.Digest {
					at = j
					break
				}
			}
			trail = append(trail, fmt.Sprintf("%s(state %d, %s)", short([]string{v.Digest})[0], at, h.when[key][i]))
			switch {
			case at >= 0:
				prev = at
			case prev >= 0 || slices.Contains(states, v.Digest):
				out = append(out, fmt.Sprintf("%s: went back to digest %s after state %d: %s",
					key, short([]string{v.Digest})[0], prev, strings.Join(trail, " -> ")))
			}
		}
	}
	sort.Strings(out)
	return out, checked
}

// markers counts the values of the bucket's term marker key: the lease
// terms that marked it.
func (h *kvHistory) markers() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.values[publish.TermKey])
}

// fencedWrites reads syncd_fenced_writes_total from a replica's /metrics;
// -1 when it cannot.
func fencedWrites(addr string) int {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + addr + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for line := range strings.SplitSeq(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, "syncd_fenced_writes_total "); ok {
			n, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return -1
			}
			return int(n)
		}
	}
	return -1
}
