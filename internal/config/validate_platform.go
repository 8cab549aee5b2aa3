package config

import (
	"slices"
	"strings"
)

func (pl *Platform) validate(p *problems) {
	if pl.BaseURL != "" {
		checkHTTPURL(p, "platform.base_url", pl.BaseURL, pl.AllowInsecureHTTP, "the platform token")
	}
	if pl.RegistryURL != "" {
		checkHTTPURL(p, "platform.registry_url", pl.RegistryURL, pl.AllowInsecureHTTP, "the registry credential")
	}
	if pl.STSURL != "" {
		checkHTTPURL(
			p,
			"platform.sts_url",
			pl.STSURL,
			pl.AllowInsecureHTTP,
			"the identity's external token and the tokens exchanged for it",
		)
	}
	pl.validateCredentials(p)
	if pl.Timeout.Duration <= 0 {
		p.addf("platform.timeout", "must be positive")
	}
}

// validateCredentials checks that each audience gets its credential from
// one source: at most one platform token source, at most one registry
// credential source, and an identity to assume only instead of both.
func (pl *Platform) validateCredentials(p *problems) {
	api := setKeys(
		map[string]string{
			"platform.token":         pl.Token,
			"platform.token_file":    pl.TokenFile,
			"platform.token_command": pl.TokenCommand,
		},
	)
	if len(api) > 1 {
		p.addf(api[0], "set only one platform credential: %s are both set", strings.Join(api, " and "))
	}
	registry := setKeys(
		map[string]string{
			"platform.registry_token":             pl.RegistryToken,
			"platform.registry_token_file":        pl.RegistryTokenFile,
			"platform.registry_token_command":     pl.RegistryTokenCommand,
			"platform.registry_credential_helper": pl.RegistryCredentialHelper,
		},
	)
	if len(registry) > 1 {
		p.addf(registry[0], "set only one registry credential: %s are both set", strings.Join(registry, " and "))
	}
	if pl.RegistryCredentialHelper != "" && strings.ContainsAny(pl.RegistryCredentialHelper, "/ \t") {
		p.addf(
			"platform.registry_credential_helper",
			"the helper's name, as in docker-credential-<name> (e.g. \"cgr\"), got %q",
			pl.RegistryCredentialHelper,
		)
	}
	if pl.Identity == "" {
		if pl.IdentityTokenFile != "" {
			p.addf("platform.identity_token_file", "only applies with platform.identity (the identity to assume)")
		}
		return
	}
	if clash := append(api, registry...); len(clash) > 0 {
		p.addf(
			clash[0],
			"platform.identity gives the credentials of both audiences by token exchange: remove %s, or remove platform.identity",
			strings.Join(clash, " and "),
		)
	}
	if pl.IdentityTokenFile == "" {
		p.addf(
			"platform.identity_token_file",
			"required with platform.identity: the file holding the external OIDC token to exchange (e.g. a Kubernetes projected service account token)",
		)
	}
	if pl.STSURL == "" {
		p.addf("platform.sts_url", "required with platform.identity: the vendor's issuer, e.g. %s", DefaultSTSURL)
	}
}

// setKeys returns the keys of m whose value is set, sorted.
func setKeys(m map[string]string) []string {
	var keys []string
	for k, v := range m {
		if v != "" {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	return keys
}
