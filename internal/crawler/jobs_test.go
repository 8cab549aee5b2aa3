package crawler_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/syncd-dev/syncd/internal/crawler"
	"github.com/syncd-dev/syncd/internal/testutil"
)

// TestScheduler_StartRuns: at start the scheduler runs each job once, in
// the order given, AtStart in place of Run where a job has one, and not a
// job that waits for its schedule or has none; a failing job does not stop
// the others.
func TestScheduler_StartRuns(t *testing.T) {
	var mu sync.Mutex
	var ran []string
	record := func(name string, err error) func(context.Context) error {
		return func(context.Context) error {
			mu.Lock()
			defer mu.Unlock()
			ran = append(ran, name)
			return err
		}
	}
	hourly := cron.Every(time.Hour)
	jobs := []crawler.Job{
		{Name: "first", Schedule: hourly, Run: record("first", errors.New("boom"))},
		{Name: "waits", Schedule: hourly, NoStartRun: true, Run: record("waits", nil)},
		{Name: "off", Run: record("off", nil)},
		{Name: "start", Schedule: hourly, Run: record("start.run", nil), AtStart: record("start.atstart", nil)},
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- crawler.Scheduler{}.Run(ctx, jobs...) }()
	testutil.WaitFor(t, 5*time.Second, "the start runs", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(ran) >= 2
	})
	mu.Lock()
	if want := []string{"first", "start.atstart"}; !slices.Equal(ran, want) {
		t.Errorf("start runs %v, want %v", ran, want)
	}
	mu.Unlock()
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
