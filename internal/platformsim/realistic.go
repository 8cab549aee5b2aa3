package platformsim

import (
	"math"
	"math/rand/v2"
)

// RealisticScenario is an organization shaped like a real one of the
// vendor's: 1,000 repos with about 200 tags each on average from a
// heavy-tailed distribution, most of them date-stamped and epoch tags with
// one or two history records, and a few tags with thousands.
func RealisticScenario() Scale {
	return Scale{Repos: 1000, TagsPerRepo: 200, Realistic: true, HeavyTags: 20, HeavyHistory: 4999, PublicImages: -1}
}

// realisticTags draws one repo's tags for Scale.Realistic: the version
// names, and sc with its date and epoch counts set for the rest.
func realisticTags(rng *rand.Rand, sc Scale) ([]string, Scale) {
	n := paretoCount(rng, sc.TagsPerRepo)
	plain := max(1, n*3/10)
	sc.DateTags = n * 4 / 10
	sc.EpochTags = max(0, n-plain-sc.DateTags)
	return tagNames(plain), sc
}

// paretoCount draws a count from a Pareto distribution (shape 1.5) with
// the given mean, capped at 20 times the mean.
func paretoCount(rng *rand.Rand, mean int) int {
	const shape = 1.5
	xm := float64(mean) * (shape - 1) / shape
	u := 1 - rng.Float64() // (0, 1]
	n := xm / math.Pow(u, 1/shape)
	return max(1, min(int(n), 20*mean))
}

// realisticRecords draws how many history records a tag has: one for
// three tags in four, two for most of the rest, a handful for a few.
func realisticRecords(rng *rand.Rand) int {
	switch r := rng.IntN(100); {
	case r < 75:
		return 1
	case r < 95:
		return 2
	default:
		return 3 + rng.IntN(18)
	}
}
