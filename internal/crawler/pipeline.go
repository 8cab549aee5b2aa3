package crawler

import (
	"context"
	"iter"

	"golang.org/x/sync/errgroup"
)

// pagesAhead is how many pages of a listing may wait for their apply.
const pagesAhead = 8

// listPipelined ranges over pages, handing each to apply in a goroutine of
// g: the next page is asked for while the writer takes the last, so a
// listing's requests, one after another, do not wait for its commits.
// listed, when set, is called with each page as it arrives; applied, when
// set, once apply has taken its last page or failed.
// ctx is g's: a failed apply cancels it, which ends the listing with ctx's
// error (g's Wait says why). It returns the listing's error once every
// page is listed.
func listPipelined[T any](
	ctx context.Context,
	g *errgroup.Group,
	pages iter.Seq2[[]T, error],
	listed func([]T),
	apply func([]T) error,
	applied func(),
) error {
	ch := make(chan []T, pagesAhead)
	g.Go(func() error {
		if applied != nil {
			defer applied()
		}
		for page := range ch {
			if err := apply(page); err != nil {
				return err
			}
		}
		return nil
	})
	defer close(ch)
	for page, err := range pages {
		if err != nil {
			return err
		}
		if listed != nil {
			listed(page)
		}
		select {
		case ch <- page:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}
