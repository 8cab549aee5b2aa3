package main

import (
	"context"
	"fmt"
	"text/tabwriter"

	"github.com/syncd-dev/syncd/internal/daemon"
	"github.com/syncd-dev/syncd/internal/store"
)

// subscriptionsCommand is "syncd subscriptions": syncd's own event
// subscriptions on the platform.
type subscriptionsCommand struct {
	m      *Main
	flags  commonFlags
	remove bool
}

func (c *subscriptionsCommand) ParseFlags(args []string) error {
	fs := c.m.flagSet("subscriptions", usage("subscriptions"), &c.flags)
	fs.BoolVar(
		&c.remove,
		"remove",
		false,
		"delete syncd's subscriptions (those whose sink is [events] sink_url) instead of listing them",
	)
	return fs.Parse(args)
}

func (c *subscriptionsCommand) Run(ctx context.Context) error {
	cfg, err := c.m.loadConfig(c.flags)
	if err != nil {
		return err
	}
	if err := cfg.RequirePlatform(); err != nil {
		return daemon.ConfigError{Err: err}
	}
	if cfg.Events.SinkURL == "" {
		return daemon.ConfigError{Err: fmt.Errorf("events.sink_url: not set, so syncd has no subscriptions to show")}
	}
	log := newLogger(c.m.Stderr, cfg.Log)
	st, err := daemon.OpenStore(ctx, cfg, log, store.Options{})
	if err != nil {
		return err
	}
	defer daemon.CloseStore(st, log)
	client, err := daemon.NewClient(cfg, log, nil)
	if err != nil {
		return daemon.ConfigError{Err: err}
	}
	reg := daemon.NewRegistrar(cfg, client, st, log)
	if c.remove {
		n, err := reg.Remove(ctx)
		fmt.Fprintf(c.m.Stdout, "removed %d subscriptions\n", n)
		return err
	}
	subs, err := reg.List(ctx)
	if err != nil {
		return err
	}
	w := tabwriter.NewWriter(c.m.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "UID\tSINK\tCREATED")
	for _, s := range subs {
		fmt.Fprintf(w, "%s\t%s\t%s\n", s.UID, s.Sink, store.FormatTime(s.CreateTime))
	}
	return w.Flush()
}
