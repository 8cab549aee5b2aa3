package main

import (
	"embed"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime/debug"
	"time"

	"github.com/lmittmann/tint"
	"github.com/mattn/go-isatty"

	"github.com/syncd-dev/syncd/internal/config"
	"github.com/syncd-dev/syncd/internal/daemon"
)

func version() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "(devel)"
}

// usageFS holds the help texts: usage/<command>.txt, printed before the
// command's flags, and usage/main.txt, syncd's own.
//
//go:embed usage/*.txt
var usageFS embed.FS

// usage is the help text of the command name.
func usage(name string) string {
	b, err := usageFS.ReadFile("usage/" + name + ".txt")
	if err != nil {
		panic(err) // a text missing from the binary is a build mistake
	}
	return string(b)
}

// commonFlags are the flags every command takes.
type commonFlags struct {
	configPath string
	logLevel   string
}

func (f *commonFlags) register(fs *flag.FlagSet) {
	fs.StringVar(
		&f.configPath,
		"config",
		"",
		"TOML configuration `file` (keys: config.example.toml), else the defaults; SYNCD_<SECTION>_<KEY> override either",
	)
	fs.StringVar(&f.logLevel, "log-level", "", "log `level`: debug, info, warn or error (overrides [log] level)")
}

// flagSet is the flag set of "syncd <name>", with the common flags; its
// --help prints usage and then the flags.
func (m *Main) flagSet(name, usage string, common *commonFlags) *flag.FlagSet {
	fs := flag.NewFlagSet("syncd "+name, flag.ContinueOnError)
	fs.SetOutput(m.Stderr)
	common.register(fs)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usage)
		fs.PrintDefaults()
	}
	return fs
}

// loadConfig loads the configuration; its errors exit 2.
func (m *Main) loadConfig(f commonFlags) (config.Config, error) {
	return m.loadConfigWith(config.Load, f)
}

// loadConfigWith loads the configuration with load; its errors exit 2.
func (m *Main) loadConfigWith(
	load func(path string, environ []string) (config.Config, error),
	f commonFlags,
) (config.Config, error) {
	cfg, err := load(f.configPath, m.Environ)
	if err != nil {
		return cfg, daemon.ConfigError{Err: err}
	}
	if f.logLevel != "" {
		cfg.Log.Level = f.logLevel
		if err := cfg.Validate(); err != nil {
			return cfg, daemon.ConfigError{Err: fmt.Errorf("--log-level: %w", err)}
		}
	}
	return cfg, nil
}

// newLogger logs with tint on a terminal and JSON otherwise.
func newLogger(w io.Writer, c config.Log) *slog.Logger {
	var level slog.Level
	level.UnmarshalText([]byte(c.Level))
	format := c.Format
	if format == "auto" {
		format = "json"
		if f, ok := w.(*os.File); ok && isatty.IsTerminal(f.Fd()) {
			format = "text"
		}
	}
	if format == "text" {
		return slog.New(tint.NewTextHandler(w, &tint.Options{Level: level, TimeFormat: time.TimeOnly}))
	}
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level}))
}
