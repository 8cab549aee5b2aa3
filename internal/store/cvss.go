package store

import (
	"math"
	"strconv"
	"strings"
)

// The platform gives an advisory's severities as CVSS vectors (or plain
// numbers) and no rating, yet "what is open, and how bad" is the question
// analysts ask first. syncd computes the base score of CVSS v3.x and v2
// vectors with the formulas of their specifications, and takes a number as
// it is. CVSS v4 scores come from a table of the specification's
// macro-vectors that syncd does not carry: a v4 vector has no base score
// here, and the views fall back to the advisory's v3 or v2 severity.

// baseScore returns the base score of a severity of the given type
// (TYPE_CVSS_V2, TYPE_CVSS_V3, TYPE_CVSS_V4), and false when it cannot tell.
func baseScore(typ, score string) (float64, bool) {
	score = strings.TrimSpace(score)
	if f, err := strconv.ParseFloat(score, 64); err == nil {
		return f, f >= 0 && f <= 10
	}
	switch {
	case strings.HasPrefix(score, "CVSS:3."):
		return cvss3(score)
	case strings.HasPrefix(score, "CVSS:4."):
		return 0, false
	case strings.HasSuffix(typ, "V2") || strings.Contains(score, "Au:"):
		return cvss2(strings.TrimPrefix(score, "("))
	}
	return 0, false
}

// rating is the qualitative severity of a base score: the CVSS v3 and v4
// scale, and for v2 the three bands NVD gives v2 scores.
func rating(typ string, base float64) string {
	if strings.HasSuffix(typ, "V2") {
		switch {
		case base >= 7:
			return "high"
		case base >= 4:
			return "medium"
		}
		return "low"
	}
	switch {
	case base >= 9:
		return "critical"
	case base >= 7:
		return "high"
	case base >= 4:
		return "medium"
	case base > 0:
		return "low"
	}
	return "none"
}

// metrics splits a vector "A:x/B:y" into its metrics; a prefix without a
// colon-separated value pair (CVSS:3.1) is kept like a metric.
func metrics(vector string) map[string]string {
	m := map[string]string{}
	for _, part := range strings.Split(strings.TrimSuffix(vector, ")"), "/") {
		if k, v, ok := strings.Cut(part, ":"); ok {
			m[k] = v
		}
	}
	return m
}

// pick looks up each metric's weight, and reports whether all were there.
func pick(m map[string]string, weights map[string]map[string]float64, names ...string) ([]float64, bool) {
	out := make([]float64, len(names))
	for i, n := range names {
		w, ok := weights[n][m[n]]
		if !ok {
			return nil, false
		}
		out[i] = w
	}
	return out, true
}

var cvss3Weights = map[string]map[string]float64{
	"AV": {"N": 0.85, "A": 0.62, "L": 0.55, "P": 0.2},
	"AC": {"L": 0.77, "H": 0.44},
	"UI": {"N": 0.85, "R": 0.62},
	"C":  {"H": 0.56, "L": 0.22, "N": 0},
	"I":  {"H": 0.56, "L": 0.22, "N": 0},
	"A":  {"H": 0.56, "L": 0.22, "N": 0},
}

// cvss3 is the CVSS v3.0/v3.1 base score of a vector.
func cvss3(vector string) (float64, bool) {
	m := metrics(vector)
	w, ok := pick(m, cvss3Weights, "AV", "AC", "UI", "C", "I", "A")
	if !ok {
		return 0, false
	}
	changed := m["S"] == "C"
	if m["S"] != "U" && !changed {
		return 0, false
	}
	pr := map[string]float64{"N": 0.85, "L": 0.62, "H": 0.27}
	if changed {
		pr["L"], pr["H"] = 0.68, 0.5
	}
	priv, ok := pr[m["PR"]]
	if !ok {
		return 0, false
	}
	iss := 1 - (1-w[3])*(1-w[4])*(1-w[5])
	impact := 6.42 * iss
	if changed {
		impact = 7.52*(iss-0.029) - 3.25*math.Pow(iss-0.02, 15)
	}
	exploitability := 8.22 * w[0] * w[1] * priv * w[2]
	if impact <= 0 {
		return 0, true
	}
	total := impact + exploitability
	if changed {
		total *= 1.08
	}
	return roundUp(math.Min(total, 10)), true
}

// roundUp is CVSS v3.1's Roundup: the smallest one-decimal number not less
// than x, computed on integers so that float noise does not add a tenth.
func roundUp(x float64) float64 {
	i := int64(math.Round(x * 100000))
	if i%10000 == 0 {
		return float64(i) / 100000
	}
	return float64(i/10000+1) / 10
}

var cvss2Weights = map[string]map[string]float64{
	"AV": {"L": 0.395, "A": 0.646, "N": 1},
	"AC": {"H": 0.35, "M": 0.61, "L": 0.71},
	"Au": {"M": 0.45, "S": 0.56, "N": 0.704},
	"C":  {"N": 0, "P": 0.275, "C": 0.660},
	"I":  {"N": 0, "P": 0.275, "C": 0.660},
	"A":  {"N": 0, "P": 0.275, "C": 0.660},
}

// cvss2 is the CVSS v2 base score of a vector.
func cvss2(vector string) (float64, bool) {
	w, ok := pick(metrics(vector), cvss2Weights, "AV", "AC", "Au", "C", "I", "A")
	if !ok {
		return 0, false
	}
	impact := 10.41 * (1 - (1-w[3])*(1-w[4])*(1-w[5]))
	exploitability := 20 * w[0] * w[1] * w[2]
	f := 1.176
	if impact == 0 {
		f = 0
	}
	return math.Round((0.6*impact+0.4*exploitability-1.5)*f*10) / 10, true
}
