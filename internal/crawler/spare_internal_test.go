package crawler

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/store"
)

// TestSpareQueue_NewestFirstTheOldestDropped: the queue hands out the
// newest tag first, keeps only the spareCap newest, hands a tag listed
// twice out once, and ends when closed.
func TestSpareQueue_NewestFirstTheOldestDropped(t *testing.T) {
	ctx := context.Background()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ref := func(i int) store.TagRef {
		return store.TagRef{UID: fmt.Sprintf("t%d", i), UpdateTime: t0.Add(time.Duration(i) * time.Minute)}
	}
	q := newSpareQueue()
	var refs []store.TagRef
	for i := range spareCap + 10 { // the 10 oldest are dropped
		refs = append(refs, ref((i*7919)%(spareCap+10))) // not in time order
	}
	q.add(refs)
	for want := spareCap + 9; want >= spareCap+9-3; want-- {
		got, ok := q.next(ctx)
		if !ok || got.UID != ref(want).UID {
			t.Fatalf("next = %s (%v), want %s", got.UID, ok, ref(want).UID)
		}
	}
	// Listed again (it moved between two pages) while its read is under
	// way: not handed out twice at once.
	q.add([]store.TagRef{ref(spareCap + 9), ref(spareCap + 20)})
	if got, _ := q.next(ctx); got.UID != ref(spareCap+20).UID {
		t.Fatalf("next = %s, want the newly listed %s", got.UID, ref(spareCap+20).UID)
	}
	if got, _ := q.next(ctx); got.UID != ref(spareCap+5).UID {
		t.Fatalf("next = %s, want %s: a tag whose read is under way came back", got.UID, ref(spareCap+5).UID)
	}
	// Once its read has ended, a later listing may ask for it again; the
	// queue keeps no set of every tag read.
	for _, i := range []int{spareCap + 9, spareCap + 8, spareCap + 7, spareCap + 6, spareCap + 20, spareCap + 5} {
		q.ended(ref(i).UID)
	}
	if n := len(q.out); n != 0 {
		t.Fatalf("%d reads remembered after all ended, want none", n)
	}
	q.add([]store.TagRef{ref(spareCap + 30)})
	if got, _ := q.next(ctx); got.UID != ref(spareCap+30).UID {
		t.Fatalf("next = %s, want %s", got.UID, ref(spareCap+30).UID)
	}
	if n := q.refs.Len(); n != spareCap-5 {
		t.Fatalf("queued = %d, want %d: the oldest past the cap are dropped", n, spareCap-5)
	}
	for _, r := range q.refs {
		if r.UpdateTime.Before(ref(10).UpdateTime) {
			t.Fatalf("tag %s kept, one of the oldest past the cap", r.UID)
		}
	}
	// A wait ends when the queue is closed.
	done := make(chan bool)
	go func() {
		for {
			if _, ok := q.next(ctx); !ok {
				done <- true
				return
			}
		}
	}()
	q.close()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("next did not return after close")
	}
}
