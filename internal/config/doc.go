// Package config loads syncd's configuration: defaults first, then a TOML file
// decoded strictly (load.go), then SYNCD_<SECTION>_<KEY> environment
// overrides (env.go), then validation, one function per section
// (validate*.go). Every problem found is reported in one run, each naming
// the key it is about and, where the file or the environment sets it, the
// line or the variable (errors.go).
//
// Its main types: Config (one struct per section: Platform, Crawl, NATS,
// Store, Events, Admin, Log, Cluster, KV, Snapshot, Verify, Query, Sync)
// and Errors (every problem found, each an Error). Default returns the
// defaults, Load reads the file and the environment and validates them.
package config
