// Package daemon builds a syncd from its configuration: each part from
// its section (the platform client, the mirror, the NATS connection and
// relay, the crawler, the receiver and registrar of pushed events, the
// follower), the observers each part is given at construction, the
// leader's role in single or cluster mode, and the admin handler that
// watches them. Commands in cmd/syncd parse flags, call it and print.
//
// Its main types: App (the parts of a syncd that crawls and publishes,
// built by Open), Leadership (the leader's duties, directly or through a
// cluster replica), FollowerApp (a mirror kept from a leader's stream,
// without the platform) and ConfigError (a problem with the command line
// or the configuration: exit 2).
package daemon
