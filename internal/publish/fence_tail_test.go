package publish_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/publish"
	"github.com/syncd-dev/syncd/internal/testutil"
)

// TestFence_AMarkerLostWithTheStreamsTailIsMarkedAgain: the server
// restarts without the stream's last messages (a crash before it synced
// them, as Jepsen found of NATS 2.12.1), this term's marker among them, so
// that the newest marker on the stream is an earlier term's. That is no
// newer term: the term is marked again (the remark confirms the lease
// around it), with no step-down, and the writes go on. When another
// replica's term began after the loss, its marker at a sequence below the
// lost one, the remark finds the lease gone: the replica steps down once
// and nothing of its term lands.
func TestFence_AMarkerLostWithTheStreamsTailIsMarkedAgain(t *testing.T) {
	for _, newer := range []bool{false, true} {
		t.Run(fmt.Sprint("a newer term after the loss: ", newer), func(t *testing.T) {
			ctx := context.Background()
			s := startServer(t, nil)
			cfg := s.config(nil)
			c := mustConnect(t, cfg)
			st := mustOpenStore(t)
			p := newProducer(t, st)
			mark(t, newFencedNode(c.JS, cfg, "a").fence) // an earlier term's marker
			a := newFencedNode(c.JS, cfg, "a")
			var leaseGone atomic.Bool
			var remarks atomic.Int32
			a.fence.SetRemark(func(ctx context.Context, lay func(context.Context) error) error {
				remarks.Add(1)
				if leaseGone.Load() {
					return errors.New("no longer the leader")
				}
				return lay(ctx)
			})
			r := publish.NewRelay(c.JS, st, cfg, publish.WithFence(a.fence))
			mark(t, a.fence)
			p.addRepos(ctx, "before", 1, 1)
			if err := r.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			stream, err := c.JS.Stream(ctx, testStream)
			if err != nil {
				t.Fatal(err)
			}
			last := lastSeq(t, stream)

			// The term's marker and the events after it are lost.
			n := int(last - 1) // all but the earlier term's marker
			s.Stop()
			s.LoseTail(testStream, n)
			s.Start()
			testutil.Eventually(t, 10*time.Second, func() error {
				_, err := stream.Info(ctx)
				return err
			})
			if got := lastSeq(t, stream); got != 1 {
				t.Fatalf("the stream's last sequence after the loss = %d, want 1 (the earlier term's marker)", got)
			}
			var newerAt uint64
			if newer {
				mark(t, newFencedNode(c.JS, cfg, "b").fence)
				leaseGone.Store(true)
				newerAt = lastSeq(t, stream)
			}

			p.addRepos(ctx, "after", 1, 1)
			pending, _, err := st.UnpublishedCount(ctx)
			if err != nil {
				t.Fatal(err)
			}
			err = r.Flush(ctx)
			if !newer && err == nil {
				t.Fatal("a write conditional on a lost marker succeeded")
			}
			remarked(t, a, &remarks)
			if newer {
				if got := a.stepDown.Load(); got != 1 || a.fence.InTerm() {
					t.Fatalf("after a newer term: stepped down %d times, in term %v; want once, false", got,
						a.fence.InTerm())
				}
				// The newer term's marker took the lost marker's sequence:
				// the server took the first flush's writes (nothing on the
				// server tells them from the newer term's), and their
				// acknowledgements, at sequences the stream had given
				// before, ended the term.
				landed := lastSeq(t, stream)
				if landed-newerAt > uint64(pending) {
					t.Errorf("%d writes landed after the newer term's marker, more than the first flush's %d",
						landed-newerAt, pending)
				}
				if !strings.Contains(a.log.String(), "this term's markers are in doubt") {
					t.Errorf("the term did not end on the sequences given again; log:\n%s", a.log.String())
				}
				p.addRepos(ctx, "later", 1, 1)
				nothingLands(t, r, stream, "the newer term")
				t.Logf("%d writes of the deposed term landed after the newer term's marker (seq %d), "+
					"all of the flush that found the sequences given again", landed-newerAt, newerAt)
				return
			}
			markedAgain(t, r, st, a)
			if !strings.Contains(a.log.String(), "marker is no longer on the stream") {
				t.Errorf("no warning of the lost marker; log:\n%s", a.log.String())
			}
		})
	}
}
