// Package platform is syncd's client for the platform API v2 and the
// registry's tag history API: typed calls, list iterators, AIP-193 errors,
// authentication, retries and the tag-history window walker.
//
// Its main types: Client (the calls, built from a Config), Lister (a
// paged list iterator), the resources it returns (Repo, Tag,
// HistoryRecord, Advisory, Group, Identity, Role, RoleBinding,
// Subscription), TokenSource and its kinds (StaticToken, FileToken,
// CommandToken, DockerCredentialHelper, ExchangeToken), and the errors a
// caller tells apart (Error, AuthError, ListRestartedError,
// UnwalkableError, WrongAudienceError).
package platform
