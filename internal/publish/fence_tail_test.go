package publish_test

import (
	"context"
	"errors"
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
// that the newest marker on the stream is an earlier term's.
//   - Alone, that is no newer term: the term is marked again (the remark
//     confirms the lease around it), with no step-down, and the writes go
//     on.
//   - When another replica's term began after the loss with its marker
//     below the lost one's sequence, the first write is refused and the
//     remark finds the lease gone: the replica steps down once and
//     nothing of its term lands.
//   - When the newer term's marker took the lost marker's very sequence,
//     the server takes the first flush's writes (nothing on the server
//     tells the two markers apart); their acknowledgements, at sequences
//     the stream had given before, end the term, the replica steps down,
//     and nothing more lands.
func TestFence_AMarkerLostWithTheStreamsTailIsMarkedAgain(t *testing.T) {
	for _, c := range []struct {
		name    string
		earlier int // earlier terms' markers before this term's
		newer   bool
	}{
		{"alone", 1, false},
		{"a newer term below the lost marker", 2, true},
		{"a newer term at the lost marker's sequence", 1, true},
	} {
		t.Run(c.name, func(t *testing.T) { lostMarker(t, c.earlier, c.newer) })
	}
}

func lostMarker(t *testing.T, earlier int, newer bool) {
	ctx := context.Background()
	s := startServer(t, nil)
	cfg := s.config(nil)
	c := mustConnect(t, cfg)
	st := mustOpenStore(t)
	p := newProducer(t, st)
	for range earlier {
		mark(t, newFencedNode(c.JS, cfg, "a").fence)
	}
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

	// The term's marker and the events after it are lost, and the
	// earlier terms' markers but the first.
	n := int(last - 1)
	s.Stop()
	s.LoseTail(testStream, n)
	s.Start()
	testutil.Eventually(t, 10*time.Second, func() error {
		_, err := stream.Info(ctx)
		return err
	})
	if got := lastSeq(t, stream); got != 1 {
		t.Fatalf("the stream's last sequence after the loss = %d, want 1 (the first term's marker)", got)
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
	reused := newer && newerAt == uint64(earlier)+1 // the newer marker took the lost one's sequence
	if !reused && err == nil {
		t.Fatal("a write conditional on a lost marker succeeded")
	}
	remarked(t, a, &remarks)
	if newer && !reused {
		if got := a.stepDown.Load(); got != 1 || a.fence.InTerm() {
			t.Fatalf("after a newer term: stepped down %d times, in term %v; want once, false", got,
				a.fence.InTerm())
		}
		if got := lastSeq(t, stream); got != newerAt {
			t.Errorf("the stream grew from seq %d (the newer term's marker) to %d", newerAt, got)
		}
		nothingLands(t, r, stream, "the newer term")
		return
	}
	if newer {
		if got := a.stepDown.Load(); got != 1 || a.fence.InTerm() {
			t.Fatalf("after a newer term: stepped down %d times, in term %v; want once, false", got,
				a.fence.InTerm())
		}
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
}

// TestFence_ADoubtDuringARemarkMarksOnceMore: a doubt that comes while the
// term is being marked again (another bucket's write acknowledged at a
// sequence given again, say) has the markers laid once more after the
// lease is confirmed, and the term opens on those: it is neither lost (a
// term left shut while the lease is held) nor taken for the markers laid
// before it.
func TestFence_ADoubtDuringARemarkMarksOnceMore(t *testing.T) {
	s := startServer(t, nil)
	cfg := s.config(nil)
	c := mustConnect(t, cfg)
	a := newFencedNode(c.JS, cfg, "a")
	entered, release := make(chan struct{}), make(chan struct{})
	var remarks atomic.Int32
	a.fence.SetRemark(func(ctx context.Context, lay func(context.Context) error) error {
		remarks.Add(1)
		entered <- struct{}{}
		<-release
		return lay(ctx)
	})
	mark(t, a.fence)
	a.fence.Doubt("first")
	<-entered
	if a.fence.InTerm() {
		t.Fatal("in term while the markers are in doubt")
	}
	a.fence.Doubt("second, while the term is marked again")
	release <- struct{}{}
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatalf("the doubt during the remark did not lay the markers once more: %d remarks", remarks.Load())
	}
	if a.fence.InTerm() {
		t.Fatal("in term before the markers were laid once more")
	}
	release <- struct{}{}
	testutil.Eventually(t, 10*time.Second, func() error {
		if !a.fence.InTerm() {
			return errors.New("the term is not open again")
		}
		return nil
	})
	if got := remarks.Load(); got != 2 || a.stepDown.Load() != 0 {
		t.Errorf("%d remarks, %d step-downs; want 2, 0", got, a.stepDown.Load())
	}
}
