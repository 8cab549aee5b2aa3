package events

import (
	"context"
	"net/http"
)

// tokenRecordPrefix begins the ids under which accepted tokens are kept in
// Deliveries, beside the Ce-Ids; verify refuses a Ce-Id beginning with it.
const tokenRecordPrefix = "token:"

// accept is the second stage of a delivery: it takes a verified delivery
// once per token and once per Ce-Id, and queues its work unless the same
// work is already waiting. It returns the status to answer.
func (r *Receiver) accept(ctx context.Context, d *verified) (int, *rejection) {
	fresh, rej := r.claimToken(ctx, d)
	if rej != nil {
		return 0, rej
	}
	if fresh {
		if fresh, rej = r.claimID(ctx, d); rej != nil {
			return 0, rej
		}
	}
	if !fresh {
		r.Stats.Duplicate.Add(1)
		return http.StatusOK, nil
	}
	if d.job == nil {
		if d.unknown {
			r.Stats.Unknown.Add(1)
		} else {
			r.Stats.Ignored.Add(1)
		}
		return http.StatusAccepted, nil
	}
	switch r.enqueue(*d.job) {
	case coalesced:
		r.Stats.Coalesced.Add(1)
		fallthrough
	case queued:
		r.Stats.Accepted.Add(1)
		return http.StatusAccepted, nil
	default:
		// The delivery is recorded but its work is not queued: forget it
		// so that the sender's retry is taken as new.
		r.release(context.WithoutCancel(ctx), d)
		return 0, refusal(http.StatusServiceUnavailable, ReasonQueueFull, "too much work queued; retry later")
	}
}

// claimToken takes the delivery's token for it. It reports false, without
// a rejection, when the token already carried this same delivery (the same
// Ce-Id): that is a redelivery, acknowledged without work. A token that
// carried another delivery is a replay, refused with 409. Tokens are kept
// in memory while they could verify, and in Deliveries across restarts.
func (r *Receiver) claimToken(ctx context.Context, d *verified) (bool, *rejection) {
	carried, fresh := r.tokens.claim(d.token, d.id, d.tokenEnd, r.cfg.Now())
	switch {
	case !fresh && carried == d.id:
		return false, nil
	case !fresh && carried != unknownDelivery:
		return false, replayed()
	case fresh:
		stored, err := r.deliveries.FirstDelivery(ctx, tokenRecordPrefix+d.token)
		if err != nil {
			r.tokens.forget(d.token)
			return false, r.unrecorded(d, err)
		}
		if stored {
			return true, nil
		}
		r.tokens.rebind(d.token, unknownDelivery)
	}
	// The token carried a delivery before this process started, and which
	// one is not known here: this one, if its Ce-Id was seen, or another.
	newID, err := r.deliveries.FirstDelivery(ctx, d.id)
	if err != nil {
		return false, r.unrecorded(d, err)
	}
	if !newID {
		return false, nil
	}
	if err := r.deliveries.ForgetDelivery(context.WithoutCancel(ctx), d.id); err != nil {
		r.log.Warn("cannot forget delivery", "id", d.id, "err", err)
	}
	return false, replayed()
}

// unknownDelivery is the Ce-Id of a token's delivery that was accepted
// before a restart; no delivery has an empty Ce-Id.
const unknownDelivery = ""

// claimID records the delivery's Ce-Id and reports whether it is new. A
// Ce-Id seen before under another token is the sender's retry of a
// delivery whose answer it did not see.
func (r *Receiver) claimID(ctx context.Context, d *verified) (bool, *rejection) {
	fresh, err := r.deliveries.FirstDelivery(ctx, d.id)
	if err != nil {
		r.release(context.WithoutCancel(ctx), d)
		return false, r.unrecorded(d, err)
	}
	return fresh, nil
}

func replayed() *rejection {
	return refusal(
		http.StatusConflict,
		ReasonReplayed,
		"this token already carried another delivery; each token is accepted once",
	)
}

func (r *Receiver) unrecorded(d *verified, err error) *rejection {
	r.log.Warn("cannot record delivery", "id", d.id, "err", err)
	return refusal(http.StatusServiceUnavailable, ReasonUnavailable, "cannot record the delivery; retry later")
}

// release forgets a delivery's Ce-Id and token, in memory and in
// Deliveries, so that the sender's retry of it is taken as new.
func (r *Receiver) release(ctx context.Context, d *verified) {
	r.tokens.forget(d.token)
	for _, id := range []string{d.id, tokenRecordPrefix + d.token} {
		if err := r.deliveries.ForgetDelivery(ctx, id); err != nil {
			r.log.Warn("cannot forget delivery", "id", d.id, "err", err)
		}
	}
}

// enqueued is what became of a job offered to the queue.
type enqueued int

const (
	queueFull enqueued = iota
	queued
	coalesced // the same job was already waiting
)

// enqueue queues j unless a job with its key is already waiting. A job a
// worker has started does not count: it may have read the resource before
// the change that this delivery reports.
func (r *Receiver) enqueue(j job) enqueued {
	r.queueMu.Lock()
	defer r.queueMu.Unlock()
	if r.pending[j.key] {
		return coalesced
	}
	select {
	case r.queue <- j:
		r.pending[j.key] = true
		return queued
	default:
		return queueFull
	}
}

// started notes that a worker took j from the queue.
func (r *Receiver) started(j job) {
	r.queueMu.Lock()
	delete(r.pending, j.key)
	r.queueMu.Unlock()
}
