// Package admin is syncd's operations endpoint: Prometheus metrics on an own
// registry, liveness and readiness. The other packages know nothing of
// Prometheus: they report through observers given to them at construction,
// which internal/daemon connects to the methods here, and the
// series and checks of watch.go read them through small interfaces.
//
// Its main types: Metrics (every series, on its own registry), Freshness
// (when each scheduled job last succeeded), ReadinessCheck (one readiness
// condition; NATSCheck, FreshnessCheck, BaselineCheck, CredentialsCheck
// and RoleCheck build them) and StatusReport (what "syncd status" prints,
// read from the mirror). Handler serves /metrics, /healthz and /readyz.
package admin
