package store_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/syncd-dev/syncd/internal/store"
)

// TestBulkWrites_AnyNumberOfRows: a page of any length is written whole,
// once (the rest after the full statements goes in statements of a power
// of two rows, kept prepared from one transaction to the next), and the
// replica digest the triggers keep on the prepared statements equals the
// rows'. Each length is written twice, so that the second write runs the
// statements the first one had prepared.
func TestBulkWrites_AnyNumberOfRows(t *testing.T) {
	ctx := context.Background()
	clk := newClock()
	st, _ := openTemp(t, clk, false, store.Options{})
	total := 0
	for i, n := range []int{1, 3, 13, 127, 199, 200, 201, 457, 13, 1} {
		repo := nginx()
		repo.UID = fmt.Sprintf("g1/r%d", i)
		repo.Name = fmt.Sprintf("image-%d", i)
		mustApplyRepos(t, st, repo)
		tags := make([]store.Tag, n)
		for j := range tags {
			tags[j] = tag(fmt.Sprintf("%s/t%d", repo.UID, j), fmt.Sprintf("1.%d", j), total+j)
		}
		mustApplyTags(t, st, repo, tags...)
		total += n
		kept, err := st.ReplicaDigest(ctx)
		if err != nil {
			t.Fatal(err)
		}
		computed, err := st.ComputeReplicaDigest(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if diff := kept.Diff(computed); diff != "" {
			t.Fatalf("after %d tags: kept digest differs from the rows' in %s", n, diff)
		}
		for _, d := range kept {
			if d.Table == "tags" && d.Rows != int64(total) {
				t.Fatalf("after a page of %d tags: %d tag rows, want %d", n, d.Rows, total)
			}
		}
	}
	// Withdrawing a set of advisories deletes their details by a JSON list
	// of uids: every one is gone, and only those.
	advs := make([]store.Advisory, 7)
	for i := range advs {
		advs[i] = store.Advisory{UID: fmt.Sprintf("a%d", i), AdvisoryID: fmt.Sprintf("CGA-%d", i), ArtifactName: "nginx",
			UpdateTime: clk.Now(), Aliases: []string{fmt.Sprintf("CVE-2026-%d", i), fmt.Sprintf("GHSA-%d", i)}}
	}
	if _, err := st.ApplyAdvisories(ctx, advs); err != nil {
		t.Fatal(err)
	}
	for i := range advs[:5] {
		advs[i].Aliases = advs[i].Aliases[:1]
	}
	if _, err := st.ApplyAdvisories(ctx, advs[:5]); err != nil {
		t.Fatal(err)
	}
	kept, err := st.ReplicaDigest(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range kept {
		if d.Table == "advisory_aliases" && d.Rows != 5+2*2 {
			t.Fatalf("%d alias rows after five advisories lost one of two, want 9", d.Rows)
		}
	}
}
