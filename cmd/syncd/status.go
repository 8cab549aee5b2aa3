package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"

	"github.com/syncd-dev/syncd/internal/admin"
	"github.com/syncd-dev/syncd/internal/store"
)

// statusCommand is "syncd status": what the mirror holds and how fresh it is.
type statusCommand struct {
	m     *Main
	flags commonFlags
	json  bool
}

func (c *statusCommand) ParseFlags(args []string) error {
	fs := c.m.flagSet("status", usage("status"), &c.flags)
	fs.BoolVar(&c.json, "json", false, "print JSON instead of a table")
	return fs.Parse(args)
}

func (c *statusCommand) Run(ctx context.Context) error {
	cfg, err := c.m.loadConfig(c.flags)
	if err != nil {
		return err
	}
	if _, err := os.Stat(cfg.Store.Path); err != nil {
		return fmt.Errorf("no mirror at %s (set [store] path, or run syncd first): %w", cfg.Store.Path, err)
	}
	st, err := store.OpenReadOnly(ctx, cfg.Store.Path)
	if err != nil {
		return err
	}
	defer st.Close()
	s, err := st.Status(ctx)
	if err != nil {
		return err
	}
	rep := admin.NewStatusReport(cfg.Store.Path, s)
	rep.EstimateBackfill(cfg.Crawl.RequestsPerSecond)
	if c.json {
		enc := json.NewEncoder(c.m.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	return rep.WriteTable(c.m.Stdout)
}
