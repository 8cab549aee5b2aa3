package platformsim

import (
	"hash/fnv"
	"strings"
)

// Protojson mode. The real service is a gRPC service behind a gateway that
// renders messages with protojson: a field at its zero value is left out,
// timestamps carry as many fractional digits (0, 3, 6 or 9) as their value
// needs, enums are spelled by their full name, and new fields appear without
// a version change. Options.ProtoJSON makes the simulator answer that way,
// so a client learns to tolerate it; the values themselves never change.

// FutureField is the name of the field ProtoJSON mode adds to every
// resource, list envelope and tag history answer and record: a field no
// client knows, as the service adds them without notice.
const FutureField = "simFutureField"

// timeKeys are the timestamp fields of rendered resources.
var timeKeys = map[string]bool{"createTime": true, "updateTime": true, "lastSeenTime": true,
	"deleteTime": true, "expirationTime": true, "updateTimestamp": true}

// futureValue is the content of FutureField: nested, with a list and an
// int64, so a strict decoder meets every shape.
func futureValue() map[string]any {
	return map[string]any{"stage": "PREVIEW", "labels": []string{"a", "b"}, "revision": "2"}
}

// wire finishes a rendered resource of the given kind for the wire; without
// ProtoJSON it is returned unchanged.
func (s *Sim) wire(kind, uid string, m map[string]any) map[string]any {
	if !s.opts.ProtoJSON {
		return m
	}
	switch kind {
	case "tag":
		delete(m, "createTime") // Tag has no create_time in the proto
	case "subscription":
		delete(m, "createTime") // Subscription is {uid, sink} only
		delete(m, "updateTime")
	case "repo":
		if t, _ := m["catalogTier"].(string); t != "" {
			m["catalogTier"] = "CATALOG_TIER_" + t
		}
		h := hash32(uid)
		if h%3 == 0 {
			// The proto gives sync_config an explicit json_name.
			m["sync_config"] = map[string]any{"source": s.opts.RootGroup + "/0123456789abcdef",
				"uniqueTags": true, "expirationTime": m["createTime"]}
		}
		if h%4 == 1 {
			m["customOverlay"] = map[string]any{"contents": map[string]any{"packages": []string{"curl", "jq"}},
				"environment": map[string]any{"SIM": "1"}}
		}
	}
	m = omitZero(uid, m)
	m[FutureField] = futureValue()
	return m
}

// omitZero drops fields at their zero value and re-renders timestamps with
// the resource's number of fractional digits, in nested objects too.
func omitZero(uid string, m map[string]any) map[string]any {
	for k, v := range m {
		switch x := v.(type) {
		case nil:
			delete(m, k)
		case string:
			if x == "" {
				delete(m, k)
			} else if timeKeys[k] {
				m[k] = protoTime(x, uid)
			}
		case bool:
			if !x {
				delete(m, k)
			}
		case int:
			if x == 0 {
				delete(m, k)
			}
		case int64:
			if x == 0 {
				delete(m, k)
			}
		case []string:
			if len(x) == 0 {
				delete(m, k)
			}
		case []any:
			if len(x) == 0 {
				delete(m, k)
			}
		case map[string]any:
			if len(omitZero(uid, x)) == 0 {
				delete(m, k)
			}
		}
	}
	return m
}

func hash32(s string) uint32 {
	h := fnv.New32a()
	h.Write([]byte(s))
	return h.Sum32()
}

// protoTime re-renders a millisecond timestamp ("…:05.123Z") as protojson
// might: whole seconds without a fraction, others with 3, 6 or 9 digits
// chosen by seed, so one resource always looks the same. The value is
// unchanged.
func protoTime(v, seed string) string {
	base, frac, ok := strings.Cut(strings.TrimSuffix(v, "Z"), ".")
	if !ok || len(frac) != 3 {
		return v
	}
	if frac == "000" {
		return base + "Z"
	}
	return base + "." + frac + strings.Repeat("0", 3*int(hash32(seed)%3)) + "Z"
}

// renderHistory is the tag history answer for records of t.
func (s *Sim) renderHistory(t *tag, recs []histRec) map[string]any {
	out := make([]map[string]any, 0, len(recs))
	for _, h := range recs {
		ts := fmtMs(h.ms)
		rec := map[string]any{"updateTimestamp": ts, "digest": fmtDigest(h.digest)}
		if s.opts.ProtoJSON {
			rec["updateTimestamp"] = protoTime(ts, t.uid+ts)
			rec[FutureField] = futureValue()
		}
		out = append(out, rec)
	}
	resp := map[string]any{"history": out}
	if s.opts.ProtoJSON {
		resp[FutureField] = futureValue()
	}
	return resp
}

// wireEnvelope finishes a list envelope: protojson leaves out a zero
// `skipped` and the envelope gains an unknown field too.
func (s *Sim) wireEnvelope(resp map[string]any) map[string]any {
	if !s.opts.ProtoJSON {
		return resp
	}
	if resp["skipped"] == 0 {
		delete(resp, "skipped")
	}
	resp[FutureField] = futureValue()
	return resp
}
