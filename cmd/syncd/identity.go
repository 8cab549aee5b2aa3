package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/syncd-dev/syncd/internal/daemon"
	"github.com/syncd-dev/syncd/internal/platform"
)

// identityCommand is "syncd identity create": the platform identity syncd
// runs as, created under the organization's root group and bound to a role.
type identityCommand struct {
	m           *Main
	flags       commonFlags
	name        string
	issuer      string
	subject     string
	description string
	role        string
	group       string
}

func (c *identityCommand) ParseFlags(args []string) error {
	fs := c.m.flagSet("identity create", usage("identity"), &c.flags)
	fs.StringVar(
		&c.name,
		"name",
		"",
		"identity `name` (required); lowercase letters, digits, space, '.', '_' and '-' ("+platform.IdentityNamePattern+")",
	)
	fs.StringVar(
		&c.issuer,
		"issuer",
		"",
		"`URL` of the OIDC issuer whose tokens the identity accepts (required), e.g. https://token.actions.githubusercontent.com",
	)
	fs.StringVar(
		&c.subject,
		"subject",
		"",
		"the `subject` the tokens carry in their \"sub\" claim, matched exactly (required), e.g. repo:acme/x:ref:refs/heads/main",
	)
	fs.StringVar(&c.description, "description", "", "free `text` shown next to the identity in the platform's console")
	fs.StringVar(&c.role, "role", "viewer", "`name` of the role to bind; syncd only reads, so viewer is enough")
	fs.StringVar(&c.group, "group", "", "root group `uid` to create the identity in (default: [platform] group)")
	// "identity" has one action today; naming it leaves room for others
	// (list, delete) without changing what "create" means.
	switch {
	case len(args) == 0:
		fs.Usage()
		return errors.New(`missing action: use "syncd identity create"`)
	case args[0] == "-h" || args[0] == "--help" || args[0] == "-help":
		fs.Usage()
		return flag.ErrHelp
	case args[0] != "create":
		return fmt.Errorf("unknown action %q: use \"syncd identity create\" (see --help)", args[0])
	}
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q: values go in flags (quote a --name with spaces)", fs.Arg(0))
	}
	var missing []string
	for _, f := range []struct{ flag, val string }{{"--name", c.name}, {"--issuer", c.issuer}, {"--subject", c.subject}} {
		if f.val == "" {
			missing = append(missing, f.flag)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%s required (see syncd identity create --help)", strings.Join(missing, ", "))
	}
	if !platform.ValidIdentityName(c.name) {
		return fmt.Errorf(
			"--name %q: must match %s (lowercase letters, digits, space, '.', '_' and '-')",
			c.name,
			platform.IdentityNamePattern,
		)
	}
	if c.role == "" {
		return errors.New("--role: must name a role, such as viewer")
	}
	return nil
}

func (c *identityCommand) Run(ctx context.Context) error {
	cfg, err := c.m.loadConfig(c.flags)
	if err != nil {
		return err
	}
	group := c.group
	if group == "" {
		group = cfg.Platform.Group
	}
	if err := cfg.RequireIdentityAdmin(group, c.group != ""); err != nil {
		return daemon.ConfigError{Err: err}
	}
	log := newLogger(c.m.Stderr, cfg.Log)
	// Identity and role binding calls never reach the registry, so a
	// config without registry_url (not needed until syncd runs) is fine.
	client, err := daemon.NewClient(cfg, log, nil)
	if err != nil {
		return daemon.ConfigError{Err: err}
	}

	id, binding, err := client.ProvisionIdentity(ctx, group, platform.Identity{Name: c.name, Description: c.description,
		ClaimMatch: platform.ClaimMatch{Issuer: c.issuer, Subject: c.subject}}, c.role)
	var unknown *platform.UnknownRoleError
	if errors.As(err, &unknown) {
		return fmt.Errorf("--%w", err) // it names the flag: --role "x": ...
	} else if err != nil {
		return err
	}
	printIdentity(c.m.Stdout, id, binding, group)
	return nil
}

func printIdentity(w io.Writer, id platform.Identity, b platform.RoleBinding, group string) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "identity\t%s\n", id.UID)
	fmt.Fprintf(tw, "name\t%s\n", id.Name)
	fmt.Fprintf(tw, "claim match\tissuer %s, subject %s\n", id.ClaimMatch.Issuer, id.ClaimMatch.Subject)
	fmt.Fprintf(tw, "role binding\t%s\n", b.UID)
	fmt.Fprintf(tw, "  identity\t%s (%s)\n", b.Identity.Name, b.Identity.UID)
	fmt.Fprintf(tw, "  group\t%s (%s)\n", b.Group.Name, b.Group.UID)
	fmt.Fprintf(tw, "  role\t%s (%s)\n", b.Role.Name, b.Role.UID)
	tw.Flush()
	fmt.Fprintf(w, `
Next, in syncd.toml: syncd assumes this identity by exchanging a token that
%[2]s issued to subject %[3]q (for example a Kubernetes
projected service account token) for one platform token and one registry
token, each renewed before it expires:

[platform]
group = %[4]q
identity = %[1]q
identity_token_file = "/var/run/secrets/tokens/syncd"  # the external token; re-read at every exchange
`, id.UID, id.ClaimMatch.Issuer, id.ClaimMatch.Subject, group)
}
