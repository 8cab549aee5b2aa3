// Package crawler walks the platform on a schedule and feeds what it reads
// to the store: repos of the configured group, the tags of each repo, and
// the history of every tag whose digest or update time changed. Its jobs,
// and the one scheduler every scheduled job of syncd runs on, are in
// jobs.go; the prune job every role runs is in prune.go, and the readying
// of a followed mirror for crawling (ResolveFollowed) in resolvefollowed.go.
//
// Its main types: Crawler (the crawl, sweep, advisories and public-image
// jobs, each returning a Summary, with Progress for "syncd status"),
// Config, Scheduler and Job (the cron scheduler every scheduled job runs
// on) and Families (which tag families a crawl follows).
package crawler
