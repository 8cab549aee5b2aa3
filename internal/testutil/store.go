package testutil

import (
	"context"
	"testing"

	"github.com/syncd-dev/syncd/internal/store"
)

// AnnounceTags applies tags of repo to st, as a listing page, and reads the
// first history of each tag the store asks for: one record, the listed
// digest at the listed update time. After the baseline, a tag is announced
// (tag.created) by its first history read, so this is what a crawl does
// for new tags that never moved. It returns the events recorded.
func AnnounceTags(tb testing.TB, st *store.Store, repo store.Repo, tags []store.Tag) int {
	tb.Helper()
	ctx := context.Background()
	need, n, err := st.ApplyTags(ctx, repo, tags)
	if err != nil {
		tb.Fatal(err)
	}
	listed := make(map[string]store.Tag, len(tags))
	for _, t := range tags {
		listed[t.UID] = t
	}
	for _, ref := range need {
		t := listed[ref.UID]
		m, err := st.ApplyHistory(ctx, ref, []store.HistoryRecord{{Time: t.UpdateTime, Digest: t.Digest}}, true)
		if err != nil {
			tb.Fatal(err)
		}
		n += m
	}
	return n
}
