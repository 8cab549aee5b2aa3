// Command syncd mirrors an organization's repos, tags, tag history and
// advisories from the vendor platform into SQLite and publishes every change
// as a CloudEvent on NATS JetStream.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"syscall"

	"github.com/syncd-dev/syncd/internal/daemon"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := NewMain(os.Stdout, os.Stderr, os.Environ()).Run(ctx, os.Args[1:])
	stop()
	os.Exit(code)
}

// Exit codes.
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2 // bad flags or configuration
)

// Main is the program: it parses the subcommand and runs it.
type Main struct {
	Stdout, Stderr io.Writer
	Environ        []string
	// Listen, when set, gives the listener for a configured address
	// ([events] listen, [admin] listen, sim --addr) instead of listening on
	// it: tests hand over listeners they opened on :0.
	Listen func(addr string) (net.Listener, error)
}

// NewMain returns a Main writing to the given streams.
func NewMain(stdout, stderr io.Writer, environ []string) *Main {
	return &Main{Stdout: stdout, Stderr: stderr, Environ: environ}
}

type command interface {
	// ParseFlags reads the subcommand's arguments.
	ParseFlags(args []string) error
	// Run does the work.
	Run(ctx context.Context) error
}

// Run runs the subcommand named by args[0] and returns the exit code.
func (m *Main) Run(ctx context.Context, args []string) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(m.Stderr, usage("main"))
		if len(args) == 0 {
			return exitUsage
		}
		return exitOK
	}
	var cmd command
	switch args[0] {
	case "run":
		cmd = &runCommand{m: m}
	case "sync":
		cmd = &syncCommand{m: m}
	case "follow":
		cmd = &followCommand{m: m}
	case "status":
		cmd = &statusCommand{m: m}
	case "sim":
		cmd = &simCommand{m: m}
	case "subscriptions":
		cmd = &subscriptionsCommand{m: m}
	case "identity":
		cmd = &identityCommand{m: m}
	case "check":
		cmd = &checkCommand{m: m}
	case "query":
		cmd = &queryCommand{m: m}
	case "version", "--version", "-version":
		fmt.Fprintln(m.Stdout, "syncd", version())
		return exitOK
	default:
		fmt.Fprintf(m.Stderr, "syncd: unknown command %q\n\n%s", args[0], usage("main"))
		return exitUsage
	}
	if err := cmd.ParseFlags(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		fmt.Fprintf(m.Stderr, "syncd %s: %v\n", args[0], err)
		return exitUsage
	}
	if err := cmd.Run(ctx); err != nil {
		fmt.Fprintf(m.Stderr, "syncd %s: %v\n", args[0], err)
		// A problem with the command line or the configuration.
		if errors.As(err, new(daemon.ConfigError)) {
			return exitUsage
		}
		return exitFailure
	}
	return exitOK
}
