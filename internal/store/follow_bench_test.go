package store_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/store"
)

// BenchmarkApplyStreamEvents measures a follower applying a leader's
// stream of creations (repos, tags, advisories with their lifecycles) and
// lifecycle steps into an empty mirror, in batches as the cluster
// follower fetches them.
func BenchmarkApplyStreamEvents(b *testing.B) {
	ctx := context.Background()
	clk := newClock()
	leader, _ := openTemp(b, clk, false, store.Options{})
	repos, tagsPerRepo, advisories := 20, 100, 800
	t0 := clk.Now()
	for r := range repos {
		repo := store.Repo{UID: fmt.Sprintf("org1/r%d", r), Name: fmt.Sprintf("image-%d", r), Description: "an image",
			Aliases: []string{"x"}, CreateTime: t0, UpdateTime: t0}
		mustApplyRepos(b, leader, repo)
		tags := make([]store.Tag, tagsPerRepo)
		for i := range tags {
			tags[i] = store.Tag{
				UID:        fmt.Sprintf("%s/t%d", repo.UID, i),
				Name:       fmt.Sprintf("1.%d", i),
				Digest:     digest(r*tagsPerRepo + i),
				Bundles:    []string{"application"},
				CreateTime: t0,
				UpdateTime: t0.Add(time.Duration(i) * time.Second),
			}
		}
		mustApplyTags(b, leader, repo, tags...)
	}
	advs := make([]store.Advisory, advisories)
	for i := range advs {
		advs[i] = store.Advisory{
			UID:          fmt.Sprintf("adv%d", i),
			AdvisoryID:   fmt.Sprintf("CGA-%d", i),
			ArtifactName: fmt.Sprintf("image-%d", i%repos),
			UpdateTime:   t0,
			Aliases:      []string{fmt.Sprintf("CVE-2025-%d", i)},
			Events: []store.AdvisoryEvent{
				{UID: fmt.Sprintf("ev%d", i), Type: "detected", CreateTime: t0, DetectionType: "scanv1"},
			},
		}
	}
	if _, err := leader.ApplyAdvisories(ctx, advs); err != nil {
		b.Fatal(err)
	}
	evs, err := leader.Unpublished(ctx, 0, 100000)
	if err != nil {
		b.Fatal(err)
	}
	stream := make([]store.StreamEvent, len(evs))
	for i, e := range evs {
		stream[i] = store.StreamEvent{ID: e.ID, Type: e.Type, Subject: e.Subject, Time: e.Time, Data: e.Data}
	}
	const batch = 1000 // the cluster follower's default
	var took time.Duration
	for range b.N {
		b.StopTimer()
		follower, _ := openTemp(b, clk, true, store.Options{})
		b.StartTimer()
		start := time.Now()
		for i := 0; i < len(stream); i += batch {
			if _, err := follower.ApplyStreamEvents(ctx, stream[i:min(i+batch, len(stream))]); err != nil {
				b.Fatal(err)
			}
		}
		took += time.Since(start)
	}
	b.ReportMetric(float64(len(stream)*b.N)/took.Seconds(), "events/s")
}
