package platform

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"
)

// HistoryRecord is one entry of a tag's digest history.
type HistoryRecord struct {
	UpdateTimestamp time.Time `json:"updateTimestamp"`
	Digest          string    `json:"digest"`
}

// historyTimeLayout is how the history API writes times: ISO 8601 with
// milliseconds, in UTC.
const historyTimeLayout = "2006-01-02T15:04:05.000Z"

// TagHistory makes one request to the tag history API: at most HistoryLimit
// records, oldest first, bounded by start and end when they are not zero.
func (c *Client) TagHistory(ctx context.Context, img Image, tag string, start, end time.Time) ([]HistoryRecord, error) {
	if err := img.check(); err != nil {
		return nil, fmt.Errorf("tag history of %s:%s: %w", img.Path(), tag, err)
	}
	if tag == "" || strings.Contains(tag, "/") {
		return nil, fmt.Errorf("tag history of %s: tag %q is not a tag name", img.Path(), tag)
	}
	u := *c.registry
	u.Path = strings.TrimRight(u.Path, "/") + "/v2/" + img.Path() + "/_" + c.cfg.Vendor + "/history/" + tag
	q := url.Values{}
	if !start.IsZero() {
		q.Set("start", start.UTC().Format(historyTimeLayout))
	}
	if !end.IsZero() {
		q.Set("end", end.UTC().Format(historyTimeLayout))
	}
	u.RawQuery = q.Encode()
	req := c.pullRequest(img)
	req.method, req.url, req.idempotent = http.MethodGet, &u, true
	var out struct {
		History []HistoryRecord `json:"history"`
	}
	if err := c.do(ctx, req, &out); err != nil {
		var apiErr *Error
		if errors.As(err, &apiErr) && apiErr.Status == http.StatusForbidden {
			return nil, &WrongAudienceError{Image: img, Err: err}
		}
		return nil, fmt.Errorf("tag history of %s:%s: %w", img.Path(), tag, err)
	}
	return out.History, nil
}

// UnwalkableError reports a history window that cannot make progress: more
// records share one timestamp than one request returns, so the ones past the
// limit cannot be reached with start and end.
type UnwalkableError struct {
	Tag  string
	Time time.Time
}

func (e *UnwalkableError) Error() string {
	return fmt.Sprintf(
		"tag history of %s: more records share the timestamp %s than one request returns; the ones past the limit cannot be read",
		e.Tag,
		e.Time.UTC().Format(time.RFC3339Nano),
	)
}

// HistorySince returns every record of the tag's history whose time is at or
// after since (all of it when since is zero), oldest first, in as many
// requests as the HistoryLimit needs.
//
// The API leaves open whether start is inclusive, and the walk must not
// depend on it. Each window asks from one millisecond (the API's resolution)
// before the newest time not yet read whole and drops what is older, so the
// records at that time come back whole either way. A server that turns out
// to be inclusive (it returns records stamped exactly at start) would spend
// part of a window on those older records, so once that is seen the walk
// asks from the time itself. Records are ordered here, stably, so that the
// server's order within one timestamp (which move came last) is kept, and
// each time is taken from exactly one window, which removes the overlap's
// duplicates without comparing digests (a tag can legitimately point at
// one digest twice within a millisecond).
//
// When a full window holds nothing but records of one time, more of them
// share that time than one request returns: the walk stops with an
// *UnwalkableError and returns what it read, rather than asking forever.
func (c *Client) HistorySince(ctx context.Context, img Image, tag string, since time.Time) ([]HistoryRecord, error) {
	var out []HistoryRecord
	from := since
	inclusive := false
	for {
		var start time.Time
		if !from.IsZero() {
			start = from
			if !inclusive {
				start = from.Add(-time.Millisecond)
			}
		}
		recs, err := c.TagHistory(ctx, img, tag, start, time.Time{})
		if err != nil {
			return out, err
		}
		full := len(recs) >= c.cfg.HistoryLimit
		slices.SortStableFunc(recs, func(a, b HistoryRecord) int { return a.UpdateTimestamp.Compare(b.UpdateTimestamp) })
		if !inclusive && !start.IsZero() && len(recs) > 0 && recs[0].UpdateTimestamp.Equal(start) {
			inclusive = true
			if full {
				// Part of the window went to records already read; ask
				// again for the records of `from` onwards alone.
				continue
			}
		}
		recs = slices.DeleteFunc(recs, func(r HistoryRecord) bool { return r.UpdateTimestamp.Before(from) })
		if !full {
			return append(out, recs...), nil
		}
		if len(recs) == 0 {
			return out, fmt.Errorf(
				"tag history of %s:%s: a full window from %s held only older records: the server does not honour start",
				img.Path(),
				tag,
				start.UTC().Format(historyTimeLayout),
			)
		}
		last := recs[len(recs)-1].UpdateTimestamp
		if recs[0].UpdateTimestamp.Equal(last) {
			// Every record of a full window shares one time: the rest of
			// that time is out of reach. Keep what was read.
			return append(out, recs...), &UnwalkableError{Tag: img.Name + ":" + tag, Time: last}
		}
		// Keep what is older than the window's newest time; the next window
		// rereads that time whole.
		for _, r := range recs {
			if r.UpdateTimestamp.Before(last) {
				out = append(out, r)
			}
		}
		from = last
	}
}
