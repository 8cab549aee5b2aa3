// Package platformsim simulates the vendor container platform's API v2 and
// its registry's tag history API, following platform-api-v2.md and, where
// that spec says "not shown", upstream-facts.md. Every test, benchmark and
// the demo of syncd run against it because the real platform cannot be
// reached from build machines.
//
// A Sim holds an organization in memory. New creates one with its root group
// and built-in roles; Populate generates repos, tags with history, and
// advisories deterministically from Options.Seed; Step and Run change the data
// over time. Handler serves the platform API and the registry on one
// http.Handler, plus the /_sim/ control API for tests.
package platformsim
