package platform

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"
)

// IdentityNamePattern is the platform's rule for identity names
// (platform-api-v2.md, Identity). Checking it before a request saves a
// round trip and names the value to fix; the server checks it again.
const IdentityNamePattern = `^[a-z0-9 ._-]{1,}$`

var identityNameRE = regexp.MustCompile(IdentityNamePattern)

// ValidIdentityName reports whether name obeys IdentityNamePattern.
func ValidIdentityName(name string) bool { return identityNameRE.MatchString(name) }

// UnknownRoleError is ProvisionIdentity's refusal of a role name that no
// role in the group has; nothing was created.
type UnknownRoleError struct {
	Role, Group string
	// Known are the names of the roles that exist, sorted.
	Known []string
}

func (e *UnknownRoleError) Error() string {
	return fmt.Sprintf(
		"role %q: no such role in group %s; roles that exist: %s (nothing was created)",
		e.Role,
		e.Group,
		strings.Join(e.Known, ", "),
	)
}

// ProvisionIdentity creates the identity id in group and binds the role
// named role to it there, leaving nothing half-done: an unknown role is
// refused (*UnknownRoleError) before anything is created, and when the
// binding fails the new identity is deleted again. A request the platform
// rejects as invalid is shown one line per field violation.
func (c *Client) ProvisionIdentity(
	ctx context.Context,
	group string,
	id Identity,
	role string,
) (Identity, RoleBinding, error) {
	r, err := c.findRole(ctx, group, role)
	if err != nil {
		return Identity{}, RoleBinding{}, err
	}
	created, err := c.CreateIdentity(ctx, group, id)
	if err != nil {
		if errors.Is(err, ErrOutcomeUnknown) {
			return Identity{}, RoleBinding{}, fmt.Errorf(
				"%w\nlook for an identity named %q in group %s before trying again",
				err,
				id.Name,
				group,
			)
		}
		return Identity{}, RoleBinding{}, rejected("the platform did not create the identity", err)
	}
	binding, err := c.CreateRoleBinding(ctx, group, created.UID, r.UID)
	if err != nil {
		cause := rejected(fmt.Sprintf("the platform did not bind role %q to identity %s", r.Name, created.UID), err)
		return Identity{}, RoleBinding{}, c.rollbackIdentity(ctx, created, cause)
	}
	return created, binding, nil
}

// findRole returns the role named name that can be bound in group.
func (c *Client) findRole(ctx context.Context, group, name string) (Role, error) {
	roles, err := c.Roles(ListQuery{DescendantsOf: group}).Collect(ctx)
	if err != nil {
		return Role{}, fmt.Errorf("list roles: %w", err)
	}
	names := make([]string, 0, len(roles))
	for _, r := range roles {
		if r.Name == name {
			return r, nil
		}
		names = append(names, r.Name)
	}
	slices.Sort(names)
	return Role{}, &UnknownRoleError{Role: name, Group: group, Known: slices.Compact(names)}
}

// rollbackIdentity deletes the identity whose role binding failed, so a
// failed provisioning leaves nothing behind; the platform deletes the
// identity's bindings with it, which also covers a binding whose creation
// answer was lost.
func (c *Client) rollbackIdentity(ctx context.Context, id Identity, cause error) error {
	// Cleanup must run even when the failure was the user's Ctrl-C.
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := c.DeleteIdentity(dctx, id.UID); err != nil {
		return fmt.Errorf(
			"%w\ndeleting the new identity %s (%q) failed too, so delete it by hand: %v",
			cause,
			id.UID,
			id.Name,
			err,
		)
	}
	return fmt.Errorf("%w\nthe new identity %s was deleted again, so nothing was left behind", cause, id.UID)
}

// rejected presents a platform error: a BadRequest as one line per field
// violation, since each names a value to fix.
func rejected(what string, err error) error {
	perr, ok := AsError(err)
	if !ok || !IsInvalidArgument(err) || len(perr.FieldViolations) == 0 {
		return fmt.Errorf("%s: %w", what, err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s: the request was invalid (HTTP %d):", what, perr.Status)
	for _, v := range perr.FieldViolations {
		fmt.Fprintf(&b, "\n  %s: %s", v.Field, v.Description)
	}
	return &rejectedError{msg: b.String(), err: err}
}

// rejectedError keeps the platform error in the chain under a message of
// its own.
type rejectedError struct {
	msg string
	err error
}

func (e *rejectedError) Error() string { return e.msg }
func (e *rejectedError) Unwrap() error { return e.err }
