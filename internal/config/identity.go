package config

import (
	"fmt"
	"strings"
)

// RequireIdentityAdmin checks the keys "syncd identity create" needs,
// fewer than a run's since it touches neither the registry nor NATS.
// group is the root group to create the identity in: [platform] group, or
// the --group flag when fromFlag.
func (c *Config) RequireIdentityAdmin(group string, fromFlag bool) error {
	switch {
	case c.Platform.BaseURL == "":
		return &Error{
			Key: "platform.base_url",
			Msg: "required (the platform API address, e.g. https://console-api.example.com)",
		}
	case c.Platform.Token == "" && c.Platform.TokenFile == "" && c.Platform.TokenCommand == "":
		return &Error{
			Key: "platform.token",
			Msg: "required: set one of token, token_file or token_command, with a token allowed to create identities",
		}
	case group == "":
		return &Error{Key: "platform.group", Msg: "required (the uid of the organization's root group), or pass --group"}
	}
	// A uid is its parent's uid, a "/" and a segment, so only a root group
	// has none; an identity below the root cannot reach the registry.
	if parent, _, ok := strings.Cut(group, "/"); ok {
		where := "--group"
		if !fromFlag {
			where = "platform.group"
		}
		return fmt.Errorf(
			"%s %q is a subgroup: an identity there is scoped to it and cannot reach the organization's registry; use the root group (%s)",
			where,
			group,
			parent,
		)
	}
	return nil
}
