package cluster_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/cluster"
	"github.com/syncd-dev/syncd/internal/publish"
	"github.com/syncd-dev/syncd/internal/store"
	"github.com/syncd-dev/syncd/internal/testutil"
)

// discard is a mirror that applies nothing: what fetching costs alone.
type discard struct{}

func (discard) ApplyStream(_ context.Context, evs []store.StreamEvent) (store.StreamResult, error) {
	return store.StreamResult{Applied: len(evs)}, nil
}

func (discard) ReplicaDigest(context.Context) (store.ReplicaDigest, error) { return nil, nil }

// BenchmarkFollower_CatchUp measures a follower joining after a leader's
// baseline (repos, tags and advisories created): "fetch" into a mirror that
// applies nothing, "apply" into an empty SQLite mirror.
func BenchmarkFollower_CatchUp(b *testing.B) {
	ctx := context.Background()
	js := testutil.JetStream(b, testutil.NATS(b).URL())
	pcfg := publish.Config{Stream: "EV", SubjectPrefix: "ev", DuplicateWindow: time.Minute, Source: "bench"}
	if err := publish.EnsureStream(ctx, js, pcfg); err != nil {
		b.Fatal(err)
	}
	leader, err := store.Open(ctx, filepath.Join(b.TempDir(), "leader.db"), store.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer leader.Close()
	if err := leader.EndBaseline(ctx); err != nil {
		b.Fatal(err)
	}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for r := range 20 {
		repo := store.Repo{
			UID:         fmt.Sprintf("org1/r%d", r),
			Name:        fmt.Sprintf("image-%d", r),
			Description: "an image",
			CreateTime:  t0,
			UpdateTime:  t0,
		}
		if _, err := leader.ApplyRepos(ctx, []store.Repo{repo}); err != nil {
			b.Fatal(err)
		}
		tags := make([]store.Tag, 200)
		for i := range tags {
			tags[i] = store.Tag{
				UID:        fmt.Sprintf("%s/t%d", repo.UID, i),
				Name:       fmt.Sprintf("1.%d", i),
				Digest:     fmt.Sprintf("sha256:%064d", r*1000+i),
				Bundles:    []string{"application"},
				CreateTime: t0,
				UpdateTime: t0.Add(time.Duration(i) * time.Second),
			}
		}
		if _, _, err := leader.ApplyTags(ctx, repo, tags); err != nil {
			b.Fatal(err)
		}
	}
	advs := make([]store.Advisory, 1000)
	for i := range advs {
		advs[i] = store.Advisory{
			UID:          fmt.Sprintf("adv%d", i),
			AdvisoryID:   fmt.Sprintf("CGA-%d", i),
			ArtifactName: fmt.Sprintf("image-%d", i%20),
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
	if err := publish.NewRelay(js, leader, pcfg).Flush(ctx); err != nil {
		b.Fatal(err)
	}
	run := 0
	for _, mode := range []string{"fetch", "apply"} {
		b.Run(mode, func(b *testing.B) {
			var took time.Duration
			events := 0
			for range b.N {
				run++
				var m cluster.Mirror = discard{}
				if mode == "apply" {
					st, err := store.Open(ctx, filepath.Join(b.TempDir(), "follower.db"), store.Options{})
					if err != nil {
						b.Fatal(err)
					}
					defer st.Close()
					m = st
				}
				f := cluster.NewFollower(
					js,
					m,
					cluster.FollowerConfig{Stream: "EV", SubjectPrefix: "ev", Consumer: fmt.Sprintf("bench%d", run),
						MaxWait: 200 * time.Millisecond, OnBatch: func(n int, _ uint64) { events += n }},
				)
				start := time.Now()
				if err := f.CatchUp(ctx); err != nil {
					b.Fatal(err)
				}
				took += time.Since(start)
			}
			b.ReportMetric(float64(events)/took.Seconds(), "events/s")
		})
	}
}
