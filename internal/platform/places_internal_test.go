package platform

import (
	"context"
	"errors"
	"testing"
	"time"
)

// enterAsync enters p for ctx in a goroutine; the channel gets the leave
// func once a place is taken (nil if ctx ended first).
func enterAsync(p *places, ctx context.Context) <-chan func() {
	got := make(chan func(), 1)
	go func() {
		leave, err := p.enter(ctx)
		if err != nil {
			leave = nil
		}
		got <- leave
	}()
	return got
}

// waitingCount polls p until n requests wait in it, or fails t.
func waitingCount(t *testing.T, p *places, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		p.mu.Lock()
		w := p.waiting.Len() + p.waitingBackground.Len()
		p.mu.Unlock()
		if w == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d requests waiting, want %d", w, n)
		}
		time.Sleep(time.Millisecond)
	}
}

func mustEnter(t *testing.T, p *places, ctx context.Context) func() {
	t.Helper()
	leave, err := p.enter(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return leave
}

func notYet(t *testing.T, got <-chan func(), what string) {
	t.Helper()
	select {
	case <-got:
		t.Fatalf("%s took a place", what)
	default:
	}
}

func taken(t *testing.T, got <-chan func(), what string) func() {
	t.Helper()
	select {
	case leave := <-got:
		if leave == nil {
			t.Fatalf("%s ended without a place", what)
		}
		return leave
	case <-time.After(5 * time.Second):
		t.Fatalf("%s took no place", what)
		return nil
	}
}

// Background requests hold at most their bound of the places, the others
// the rest; a place that frees goes to a waiting request that is not
// background before the background ones that came earlier.
func TestPlaces_BackgroundGivesWay(t *testing.T) {
	p := newPlaces(3)
	ctx := context.Background()
	bg := InBackground(ctx, 2)
	b1, b2 := mustEnter(t, p, bg), mustEnter(t, p, bg)
	b3 := enterAsync(p, bg)
	waitingCount(t, p, 1)
	notYet(t, b3, "a third background request, past its bound")
	o1 := mustEnter(t, p, ctx) // the place the bound leaves
	o2 := enterAsync(p, ctx)
	waitingCount(t, p, 2)
	// b1's place: the background request waiting could take it now (one
	// background request holds a place), but the other came after it and
	// goes first.
	b1()
	leaveO2 := taken(t, o2, "the request that is not background")
	notYet(t, b3, "the background request, with every place held")
	o1()
	taken(t, b3, "the background request, once a place is free")()
	b2()
	leaveO2()
	// Every place is free again.
	for range 3 {
		defer mustEnter(t, p, ctx)()
	}
}

// A request whose context ends while it waits takes no place and keeps
// none from the requests behind it.
func TestPlaces_AWaitCanceled(t *testing.T) {
	p := newPlaces(1)
	ctx := context.Background()
	bg := InBackground(ctx, 1)
	held := mustEnter(t, p, ctx)
	cctx, cancel := context.WithCancel(bg)
	canceled := enterAsync(p, cctx)
	behind := enterAsync(p, bg)
	waitingCount(t, p, 2)
	cancel()
	if leave := <-canceled; leave != nil {
		t.Fatal("a canceled wait took a place")
	}
	if _, err := p.enter(cctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("enter with an ended context: %v", err)
	}
	held()
	taken(t, behind, "the request behind the canceled one")()
	mustEnter(t, p, ctx)()
}
