package platformsim

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"time"
)

// imageWords name generated repos; past the list they get numeric suffixes.
func imageWords() []string {
	return []string{"nginx", "python", "go", "node", "static", "busybox", "redis",
		"postgres", "jdk", "jre", "ruby", "php", "rust", "git", "curl", "wolfi-base",
		"kubectl", "helm", "prometheus", "grafana", "envoy", "traefik", "vault",
		"consul", "etcd", "coredns", "memcached", "rabbitmq", "kafka", "zookeeper",
		"mariadb", "mysql", "mongodb", "elasticsearch", "fluent-bit", "cert-manager",
		"argocd", "istio-proxy", "dotnet-runtime", "bazel"}
}

// newSegmentFrom draws a 16 hex digit uid segment.
func newSegmentFrom(rng *rand.Rand) string {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], rng.Uint64())
	return hex.EncodeToString(b[:])
}

// newUIDLocked returns a fresh child uid of parent.
func (s *Sim) newUIDLocked(parent string) string {
	for {
		uid := parent + "/" + newSegmentFrom(s.rng)
		if !s.uidTakenLocked(uid) {
			return uid
		}
	}
}

func (s *Sim) uidTakenLocked(uid string) bool {
	if _, ok := s.groups[uid]; ok {
		return true
	}
	if _, ok := s.repos[uid]; ok {
		return true
	}
	if _, ok := s.tags[uid]; ok {
		return true
	}
	if _, ok := s.identities[uid]; ok {
		return true
	}
	if _, ok := s.bindings[uid]; ok {
		return true
	}
	_, ok := s.subscriptions[uid]
	return ok
}

func randDigest(rng *rand.Rand) [32]byte {
	var d [32]byte
	for i := 0; i < 32; i += 8 {
		binary.LittleEndian.PutUint64(d[i:], rng.Uint64())
	}
	return d
}

// tagNames returns n distinct tag names in the style of an image catalog.
func tagNames(n int) []string {
	out := make([]string, 0, n)
	for _, t := range []string{"latest", "latest-dev"} {
		if len(out) < n {
			out = append(out, t)
		}
	}
	for i := 0; len(out) < n; i++ {
		v := fmt.Sprintf("%d.%d.%d", 1+i/50, (i/10)%5, i%10)
		out = append(out, v)
		if len(out) < n {
			out = append(out, v+"-dev")
		}
	}
	return out
}

// Populate generates a deterministic organization from Options.Seed: repos
// under the root group (Scale.NestedRepos of them below subgroups), their tags with history (oldest first, each tag's
// digest being its last record's), advisories, and public images. Data is
// stamped in the past relative to the simulator's current time. No events
// are sent for generated data.
func (s *Sim) Populate(sc Scale) {
	rng := rand.New(rand.NewPCG(uint64(s.opts.Seed), 0x909))
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.nowLocked().UnixMilli()
	words := imageWords()

	totalTags := sc.Repos * sc.TagsPerRepo
	heavyEvery := 0
	if sc.HeavyTags > 0 && totalTags > 0 {
		heavyEvery = max(1, totalTags/sc.HeavyTags)
	}
	heavyLeft := sc.HeavyTags
	names := tagNames(sc.TagsPerRepo)
	tagIndex := 0
	nestedFrom := sc.Repos - max(sc.NestedRepos, 0)
	for i := range sc.Repos {
		name := words[i%len(words)]
		if i >= len(words) {
			name = fmt.Sprintf("%s-%d", name, i/len(words))
		}
		parent := s.opts.RootGroup
		if i >= nestedFrom {
			parent = s.subgroupLocked(rng, i-nestedFrom, now)
		}
		for s.repoByNameLocked(parent, name) != nil {
			name += "-x"
		}
		rp := &repo{uid: s.newSegmentUIDLocked(rng, parent), name: name,
			description: "Minimal image for " + name, catalogTier: catalogTier(i),
			tags: make(map[string]*tag, sc.TagsPerRepo)}
		first := now
		addTag := func(tn string, records int) *tag {
			t := &tag{uid: s.newSegmentUIDLocked(rng, rp.uid), repoUID: rp.uid, name: tn}
			t.history = genHistory(rng, now, max(records, 1))
			last := t.history[len(t.history)-1]
			t.digest, t.createMs, t.updateMs = last.digest, t.history[0].ms, last.ms
			first = min(first, t.createMs)
			rp.tags[t.uid] = t
			s.tags[t.uid] = t
			s.indexTagLocked(t)
			return t
		}
		repoNames, fam := names, sc
		if sc.Realistic {
			repoNames, fam = realisticTags(rng, sc)
		}
		var latest *tag
		for _, tn := range repoNames {
			records := sc.HistoryPerTag
			if sc.Realistic {
				records = realisticRecords(rng)
			}
			if heavyEvery > 0 && heavyLeft > 0 && tagIndex%heavyEvery == 0 {
				records = sc.HeavyHistory
				heavyLeft--
			}
			tagIndex++
			t := addTag(tn, records)
			if tn == "latest" {
				latest = t
			}
			t.deprecated = tn != "latest" && tn != "latest-dev" && rng.IntN(20) == 0
			if !t.deprecated && len(rp.activeTags) < 5 {
				rp.activeTags = append(rp.activeTags, tn)
			}
		}
		// The families the tag list hides come after, so a scale without
		// them draws exactly what it drew before they existed.
		today := "latest-" + time.UnixMilli(now).UTC().Format("20060102")
		for _, tn := range familyTagNames(rng, fam, now) {
			records := sc.HistoryPerTag
			if sc.Realistic {
				records = realisticRecords(rng)
			}
			t := addTag(tn, records)
			// A date tag is the day's snapshot of latest: today's still
			// carries latest's image, so one digest has several tags.
			if tn == today && latest != nil {
				t.history[len(t.history)-1].digest = latest.digest
				t.digest = latest.digest
			}
		}
		rp.createMs = first - int64(rng.IntN(30*24))*int64(time.Hour/time.Millisecond) - 1
		rp.updateMs = rp.createMs + int64(rng.Int64N(now-rp.createMs+1))
		s.repos[rp.uid] = rp
		s.indexRepoLocked(rp)
	}
	for range sc.Advisories {
		a := &advisory{uid: s.newSegmentUIDLocked(rng, "") + newSegmentFrom(rng),
			advisoryID:   advisoryID(rng),
			artifactName: words[rng.IntN(len(words))]}
		a.createMs = now - rng.Int64N(365*24*int64(time.Hour/time.Millisecond))
		a.updateMs = a.createMs + rng.Int64N(now-a.createMs+1)
		detail := advisoryRand(s.opts.Seed, a.uid)
		fillAdvisory(detail, a, sc.Advisories/3, s.opts.ErrorDomain)
		growLifecycle(detail, a)
		s.addAdvisoryLocked(a)
	}
	pub := sc.PublicImages
	if pub == 0 {
		pub = 3
	}
	for i := 0; i < pub && i < len(words); i++ {
		pi := &publicImage{name: words[i], tags: map[string]*tag{}}
		for _, tn := range []string{"latest", "latest-dev", "1"} {
			t := &tag{uid: "public/" + words[i] + "/" + tn, name: tn}
			t.history = genHistory(rng, now, max(sc.HistoryPerTag, 3))
			last := t.history[len(t.history)-1]
			t.digest, t.createMs, t.updateMs = last.digest, t.history[0].ms, last.ms
			pi.tags[tn] = t
		}
		s.public[pi.name] = pi
	}
}

// familyTagNames names one repo's tags of the hidden families: dates
// (latest-20250301, a day apart back from now), epochs (2.0.<k>-r<k%3>) and
// referrers (sha256-<hex>.sig or .att).
func familyTagNames(rng *rand.Rand, sc Scale, now int64) []string {
	var out []string
	day := time.UnixMilli(now).UTC()
	for k := range sc.DateTags {
		out = append(out, "latest-"+day.AddDate(0, 0, -k).Format("20060102"))
	}
	for k := range sc.EpochTags {
		out = append(out, fmt.Sprintf("2.0.%d-r%d", k, k%3))
	}
	for k := range sc.ReferrerTags {
		suffix := ".sig"
		if k%2 == 1 {
			suffix = ".att"
		}
		d := randDigest(rng)
		out = append(out, "sha256-"+hex.EncodeToString(d[:])+suffix)
	}
	return out
}

// subgroupNames are the first-level subgroups nested repos live in; each
// has a second-level subgroup "stable".
var subgroupNames = [...]string{"charts", "tools", "platform"}

// subgroupLocked returns the group the j-th nested repo goes into:
// alternately a first-level subgroup and its "stable" child, creating them
// on first use.
func (s *Sim) subgroupLocked(rng *rand.Rand, j int, now int64) string {
	g := s.childGroupLocked(rng, s.opts.RootGroup, subgroupNames[(j/2)%len(subgroupNames)], now)
	if j%2 == 1 {
		g = s.childGroupLocked(rng, g, "stable", now)
	}
	return g
}

// childGroupLocked finds or creates the group called name under parent.
func (s *Sim) childGroupLocked(rng *rand.Rand, parent, name string, now int64) string {
	for uid, g := range s.groups {
		if g.name == name && parentOf(uid) == parent {
			return uid
		}
	}
	created := now - 400*24*int64(time.Hour/time.Millisecond)
	g := &group{uid: s.newSegmentUIDLocked(rng, parent), name: name,
		description: "Subgroup " + name, createMs: created, updateMs: created}
	s.groups[g.uid] = g
	return g.uid
}

// newSegmentUIDLocked is newUIDLocked drawing from a given generator, so
// Populate's output does not depend on earlier API activity.
func (s *Sim) newSegmentUIDLocked(rng *rand.Rand, parent string) string {
	for {
		uid := newSegmentFrom(rng)
		if parent != "" {
			uid = parent + "/" + uid
		}
		if !s.uidTakenLocked(uid) {
			return uid
		}
	}
}

func catalogTier(i int) string {
	switch i % 3 {
	case 0:
		return "APPLICATION"
	case 1:
		return "BASE"
	default:
		return "FIPS"
	}
}

func advisoryID(rng *rand.Rand) string {
	const alphabet = "23456789cfghjmpqrvwx"
	b := []byte("CGA-xxxx-xxxx-xxxx")
	for i := range b {
		if b[i] == 'x' {
			b[i] = alphabet[rng.IntN(len(alphabet))]
		}
	}
	return string(b)
}

// genHistory makes n records ending before now, oldest first. Long
// histories are dense (minutes apart) and contain a run of records sharing
// one timestamp around every 1000-record boundary, the case that breaks
// clients paging with an exclusive `start`.
func genHistory(rng *rand.Rand, now int64, n int) []histRec {
	const minute = int64(time.Minute / time.Millisecond)
	spacing := 6 * 60 * minute
	if n > 1000 {
		spacing = 5 * minute
	}
	recs := make([]histRec, n)
	t := now - int64(n+1)*spacing
	for i := range recs {
		sameAsPrev := i > 0 && n > 1000 && isBoundaryRun(i)
		if !sameAsPrev && i > 0 {
			t += spacing/2 + rng.Int64N(spacing) + 1
		}
		recs[i] = histRec{ms: t, digest: randDigest(rng)}
	}
	// Keep the newest record in the past even after random spacing, at a
	// random distance from now: pinning every such tag to now-1ms would
	// make half the organization look updated in the same millisecond.
	if over := recs[n-1].ms - (now - 1); over > 0 {
		over += rng.Int64N(spacing/2 + 1)
		for i := range recs {
			recs[i].ms -= over
		}
	}
	return recs
}

// isBoundaryRun reports whether record i continues the shared-timestamp run
// that spans records k*1000-5 .. k*1000+5.
func isBoundaryRun(i int) bool {
	r := i % 1000
	return i >= 995 && (r >= 996 || r <= 5)
}
