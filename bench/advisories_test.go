package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/syncd-dev/syncd/internal/platformsim"
)

// The simulator's names for the advisory endpoints, in Stats.
const (
	advisoryListEndpoint = "GET /vulnerabilities/v2/advisories"
	advisoryGetEndpoint  = "GET /vulnerabilities/v2/advisories/{uid}"
)

// advisoryResult is what the advisories job cost after some advisories
// took a step of their lifecycle. The platform has no updated_since for
// advisories, so each run lists them all: its floor is the list's pages.
type advisoryResult struct {
	Advisories int `json:"advisories"`
	// Steps is how many advisories took one lifecycle step before the run.
	Steps int `json:"steps"`
	// ListRequests and GetRequests are the requests the run made; Minimum
	// is ceil(advisories/200), the pages of one listing.
	ListRequests int     `json:"list_requests"`
	GetRequests  int     `json:"get_requests"`
	Requests     int     `json:"requests"`
	Minimum      int     `json:"minimum_requests"`
	Ratio        float64 `json:"ratio"`
	// FullSyncRequests are the advisory requests of the full initial sync.
	FullSyncRequests int           `json:"full_sync_requests"`
	Wall             time.Duration `json:"wall_ns"`
	WallSeconds      float64       `json:"wall_s"`
	// Events are the events it recorded: an advisory.updated and the step
	// (advisory.fixed, ...) for each advisory that moved.
	Events int64 `json:"events"`
}

// measureAdvisories moves 1% of the organization's advisories one step
// along their lifecycle (each is found fixed) and runs the advisories job
// on mirror m, counting the requests the simulator served.
func measureAdvisories(ctx context.Context, o *org, m *mirror) (advisoryResult, error) {
	advs := o.sim.Truth().Advisories
	r := advisoryResult{Advisories: len(advs), Minimum: max(1, (len(advs)+199)/200)}
	o.sim.Advance(time.Second)
	for i := 0; i < len(advs) && r.Steps < max(1, len(advs)/100); i++ {
		a := advs[(i*97)%len(advs)]
		if a.DeleteTime != nil {
			continue
		}
		if _, err := o.sim.Apply(platformsim.Mutation{Kind: platformsim.AdvisoryEventAdded, UID: a.UID,
			Event: platformsim.EventFixed}); err != nil {
			return r, fmt.Errorf("advance advisory %s: %w", a.UID, err)
		}
		r.Steps++
	}
	o.sim.ResetStats()
	start := time.Now()
	sum, err := m.crawler.SyncAdvisories(ctx)
	if err != nil {
		return r, fmt.Errorf("sync advisories: %w", err)
	}
	r.Wall = time.Since(start)
	r.WallSeconds = r.Wall.Seconds()
	st := o.sim.Stats()
	r.ListRequests, r.GetRequests = st.ByEndpoint[advisoryListEndpoint], st.ByEndpoint[advisoryGetEndpoint]
	r.Requests = st.Total
	r.Ratio = float64(r.Requests) / float64(r.Minimum)
	r.Events = sum.Events
	return r, nil
}
