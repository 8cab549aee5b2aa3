package platform

import (
	"context"
	"fmt"
	"net/http"
	"time"
)

// Identity is an IAM identity: who may act, recognized by the issuer and
// subject of an external token.
type Identity struct {
	UID          string     `json:"uid,omitempty"`
	Name         string     `json:"name"`
	Description  string     `json:"description,omitempty"`
	ClaimMatch   ClaimMatch `json:"claimMatch"`
	LastSeenTime time.Time  `json:"lastSeenTime,omitzero"`
	CreateTime   time.Time  `json:"createTime,omitzero"`
	UpdateTime   time.Time  `json:"updateTime,omitzero"`
}

// ClaimMatch names the external token an identity may assume; the subject
// must match the token's exactly.
type ClaimMatch struct {
	Issuer  string `json:"issuer,omitempty"`
	Subject string `json:"subject,omitempty"`
}

// Role is an IAM role; built-in ones (such as "viewer") exist in every
// organization.
type Role struct {
	UID         string    `json:"uid"`
	Name        string    `json:"name"`
	Description string    `json:"description,omitempty"`
	CreateTime  time.Time `json:"createTime,omitzero"`
	UpdateTime  time.Time `json:"updateTime,omitzero"`
}

// RoleBinding grants a role to an identity in a group. The API hydrates the
// references, so no follow-up lookups are needed.
type RoleBinding struct {
	UID        string              `json:"uid"`
	Identity   RoleBindingIdentity `json:"identity"`
	Group      Ref                 `json:"group"`
	Role       Ref                 `json:"role"`
	CreateTime time.Time           `json:"createTime,omitzero"`
	UpdateTime time.Time           `json:"updateTime,omitzero"`
}

// RoleBindingIdentity is the identity as a role binding shows it.
type RoleBindingIdentity struct {
	UID         string `json:"uid"`
	Name        string `json:"name"`
	Description string `json:"description,omitempty"`
	Subject     string `json:"subject,omitempty"`
	Issuer      string `json:"issuer,omitempty"`
}

// Ref is a hydrated reference to a group or a role.
type Ref struct {
	UID         string `json:"uid"`
	Name        string `json:"name"`
	Description string `json:"description,omitempty"`
}

// Subscription registers a sink (an https:// URL) that receives the
// platform's events for a group.
type Subscription struct {
	UID        string    `json:"uid"`
	Sink       string    `json:"sink"`
	CreateTime time.Time `json:"createTime,omitzero"`
	UpdateTime time.Time `json:"updateTime,omitzero"`
}

// Creates are sent once: they are not idempotent, so do repeats them only
// after a 429 or a failed connect, which the server never acted on. Any
// other failure that may have reached the server wraps ErrOutcomeUnknown.

// CreateIdentity creates an identity under the group parentGroupUID. Only
// id's Name, Description and ClaimMatch are sent.
func (c *Client) CreateIdentity(ctx context.Context, parentGroupUID string, id Identity) (Identity, error) {
	body := struct {
		Name        string     `json:"name"`
		Description string     `json:"description,omitempty"`
		ClaimMatch  ClaimMatch `json:"claimMatch"`
	}{id.Name, id.Description, id.ClaimMatch}
	var out Identity
	if err := c.call(ctx, http.MethodPost, "/iam/v2/identities", parentGroupUID, body, &out); err != nil {
		return out, fmt.Errorf("create identity %q in group %s: %w", id.Name, parentGroupUID, err)
	}
	return out, nil
}

// DeleteIdentity deletes an identity. A retried delete whose earlier
// attempt may have gone through counts a 404 as done.
func (c *Client) DeleteIdentity(ctx context.Context, uid string) error {
	if err := c.call(ctx, http.MethodDelete, "/iam/v2/identities", uid, nil, nil); err != nil {
		return fmt.Errorf("delete identity %s: %w", uid, err)
	}
	return nil
}

// Roles lists roles.
func (c *Client) Roles(q ListQuery) *Lister[Role] {
	return &Lister[Role]{c: c, path: "/iam/v2/roles", q: q, key: "roles", uid: func(r Role) string { return r.UID }}
}

// CreateRoleBinding grants roleUID to identityUID in the group
// parentGroupUID and returns the binding with its references hydrated.
func (c *Client) CreateRoleBinding(
	ctx context.Context,
	parentGroupUID, identityUID, roleUID string,
) (RoleBinding, error) {
	body := struct {
		IdentityUID string `json:"identityUid"`
		RoleUID     string `json:"roleUid"`
	}{identityUID, roleUID}
	var out RoleBinding
	if err := c.call(ctx, http.MethodPost, "/iam/v2/roleBindings", parentGroupUID, body, &out); err != nil {
		return out, fmt.Errorf("bind role %s to identity %s in group %s: %w", roleUID, identityUID, parentGroupUID, err)
	}
	return out, nil
}

// DeleteRoleBinding deletes a role binding.
func (c *Client) DeleteRoleBinding(ctx context.Context, uid string) error {
	if err := c.call(ctx, http.MethodDelete, "/iam/v2/roleBindings", uid, nil, nil); err != nil {
		return fmt.Errorf("delete role binding %s: %w", uid, err)
	}
	return nil
}

// Subscriptions lists event subscriptions.
func (c *Client) Subscriptions(q ListQuery) *Lister[Subscription] {
	return &Lister[Subscription]{
		c:    c,
		path: "/events/v2/subscriptions",
		q:    q,
		key:  "subscriptions",
		uid:  func(s Subscription) string { return s.UID },
	}
}

// GetSubscription fetches one subscription.
func (c *Client) GetSubscription(ctx context.Context, uid string) (Subscription, error) {
	var out Subscription
	if err := c.call(ctx, http.MethodGet, "/events/v2/subscriptions", uid, nil, &out); err != nil {
		return out, fmt.Errorf("get subscription %s: %w", uid, err)
	}
	return out, nil
}

// CreateSubscription subscribes sink to the events of the group
// parentGroupUID.
func (c *Client) CreateSubscription(ctx context.Context, parentGroupUID, sink string) (Subscription, error) {
	body := struct {
		Sink string `json:"sink"`
	}{sink}
	var out Subscription
	if err := c.call(ctx, http.MethodPost, "/events/v2/subscriptions", parentGroupUID, body, &out); err != nil {
		return out, fmt.Errorf("create subscription in group %s: %w", parentGroupUID, err)
	}
	return out, nil
}

// DeleteSubscription deletes a subscription.
func (c *Client) DeleteSubscription(ctx context.Context, uid string) error {
	if err := c.call(ctx, http.MethodDelete, "/events/v2/subscriptions", uid, nil, nil); err != nil {
		return fmt.Errorf("delete subscription %s: %w", uid, err)
	}
	return nil
}

// Group is an IAM group: an organization (a root group) or a folder below
// one. Repos below a folder have the folder's name in their registry path.
type Group struct {
	UID         string    `json:"uid"`
	Name        string    `json:"name"`
	Description string    `json:"description,omitempty"`
	Verified    bool      `json:"verified,omitempty"`
	CreateTime  time.Time `json:"createTime,omitzero"`
	UpdateTime  time.Time `json:"updateTime,omitzero"`
}

// Groups lists groups; q.DescendantsOf or q.ChildrenOf a group uid for the
// folders below it.
func (c *Client) Groups(q ListQuery) *Lister[Group] {
	return &Lister[Group]{c: c, path: "/iam/v2/groups", q: q, key: "groups", uid: func(g Group) string { return g.UID }}
}

// GetGroup fetches one group.
func (c *Client) GetGroup(ctx context.Context, uid string) (Group, error) {
	var out Group
	if err := c.call(ctx, http.MethodGet, "/iam/v2/groups", uid, nil, &out); err != nil {
		return out, fmt.Errorf("get group %s: %w", uid, err)
	}
	return out, nil
}
