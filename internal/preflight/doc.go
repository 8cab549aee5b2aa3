// Package preflight holds the checks of "syncd check": one request per
// platform credential, each to the audience it is for, and one NATS round
// trip, each giving a verdict that says what to fix. Nothing is written.
//
// Its one type, Check, is one check: what it is about (Subject) and the
// request that gives its verdict (Run); Checks builds the checks a
// configuration calls for.
package preflight
