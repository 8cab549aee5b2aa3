// Package events is syncd's fast path: it registers a subscription with the
// platform so that changes are pushed to syncd, verifies each pushed
// CloudEvent, and maps it to the crawler job that refreshes what changed.
//
// A delivery goes through two stages. verify (verify.go) decides whether the
// platform sent it: the token, the body it signs, and headers that agree
// with that body. accept (accept.go) decides whether it is new: one
// delivery per token, one piece of work per Ce-Id, and one queued job per
// resource.
//
// Its main types: Receiver (the HTTP endpoint the platform delivers to,
// counting what it did in Stats), Registrar (keeps the subscription
// registered) and Config; Jobs is what it needs of the crawler and
// Deliveries what it needs of the store.
package events
