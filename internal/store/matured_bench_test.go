package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/store"
)

// BenchmarkMature measures tags that mature on the full-size organization's
// history (50,000 tags of 20 records: a million rows; BENCH_SCALE scales
// the tags): "first" is the first run, which recomputes every tag and
// announces each tag's matured digest once (maturity turned on for an
// existing mirror, or a new leader), "next" a run after one tag moved
// (the mean of three).
func BenchmarkMature(b *testing.B) {
	ctx := context.Background()
	const perTag = 20
	tags := max(int(50_000*benchScale(b)), 1)
	ages := []time.Duration{72 * time.Hour}
	var first, next time.Duration
	for range b.N {
		b.StopTimer()
		clk := newClock()
		st, _ := openTemp(b, clk, true, store.Options{})
		if err := st.DeferIndexes(ctx); err != nil {
			b.Fatal(err)
		}
		refs := ingestTags(b, st, tags)
		for start := 0; start < len(refs); start += 100 {
			var ups []store.HistoryUpdate
			for i := start; i < min(start+100, len(refs)); i++ {
				ups = append(ups, store.HistoryUpdate{Ref: refs[i], Records: historyOf(i, perTag), Complete: true})
			}
			if _, err := st.ApplyHistories(ctx, ups); err != nil {
				b.Fatal(err)
			}
		}
		if err := st.EndBaseline(ctx); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		start := time.Now()
		res, err := st.Mature(ctx, ages)
		first += time.Since(start)
		if err != nil || res.Events != tags {
			b.Fatalf("first run: %+v, %v; want %d events", res, err, tags)
		}
		b.StopTimer()
		rec := historyOf(0, perTag)
		for k := range 3 {
			rec = append(rec, store.HistoryRecord{Time: clk.Now(), Digest: digest(-1 - k)})
			if _, err := st.ApplyHistory(ctx, refs[0], rec, true); err != nil {
				b.Fatal(err)
			}
			clk.Advance(72 * time.Hour)
			b.StartTimer()
			start = time.Now()
			res, err = st.Mature(ctx, ages)
			d := time.Since(start)
			b.StopTimer()
			next += d
			if err != nil || res.Events != 1 {
				b.Fatalf("next run: %+v, %v; want 1 event", res, err)
			}
		}
	}
	b.ReportMetric(first.Seconds()/float64(b.N), "first-s")
	b.ReportMetric(float64(next.Microseconds())/1000/float64(3*b.N), "next-ms")
	b.ReportMetric(float64(tags*perTag), "history-rows")
}
