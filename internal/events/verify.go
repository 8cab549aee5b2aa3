package events

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
)

// verified is a delivery the platform sent: its token verified, its body is
// the one the token signs, and its headers agree with that body.
type verified struct {
	id, typ string
	// token identifies the delivery's token: its jti, or else its body
	// digest and issue time. One token carries one delivery.
	token string
	// tokenEnd is when the token stops verifying (exp, or iat plus the
	// maximum age), so that it need not be remembered any longer.
	tokenEnd time.Time
	job      *job // nil: the delivery asks for nothing
	unknown  bool // no job because the type is not one syncd knows
}

// verify is the first stage of a delivery: it decides whether the platform
// sent it, and what it asks for. Nothing is recorded here, so a refused
// delivery leaves no trace that could refuse the genuine one.
func (r *Receiver) verify(w http.ResponseWriter, req *http.Request) (*verified, *rejection) {
	if req.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		return nil, refusal(http.StatusMethodNotAllowed, ReasonMethod, "deliveries are POSTs")
	}
	raw, ok := strings.CutPrefix(req.Header.Get("Authorization"), "Bearer ")
	if !ok || strings.TrimSpace(raw) == "" {
		w.Header().Set("WWW-Authenticate", `Bearer realm="syncd"`)
		return nil, refusal(http.StatusUnauthorized, ReasonNoToken, "a bearer token is required")
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, req.Body, r.cfg.MaxBody))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return nil, refusal(http.StatusRequestEntityTooLarge, ReasonTooLarge, "the body exceeds %d bytes", r.cfg.MaxBody)
		}
		return nil, refusal(http.StatusBadRequest, ReasonMalformed, "could not read the body")
	}
	d := &verified{}
	var rej *rejection
	if d.token, d.tokenEnd, rej = r.verifyToken(req.Context(), raw, body); rej != nil {
		return nil, rej
	}
	d.id, d.typ = req.Header.Get("Ce-Id"), req.Header.Get("Ce-Type")
	if d.id == "" || d.typ == "" || req.Header.Get("Ce-Specversion") == "" {
		return nil, refusal(
			http.StatusBadRequest,
			ReasonMalformed,
			"Ce-Id, Ce-Type and Ce-Specversion headers are required (CloudEvents binary mode)",
		)
	}
	if strings.HasPrefix(d.id, tokenRecordPrefix) {
		return nil, refusal(http.StatusBadRequest, ReasonMalformed, "a Ce-Id may not begin with %q", tokenRecordPrefix)
	}
	if d.job, d.unknown, rej = r.mapEvent(d.typ, req.Header.Get("Ce-Subject"), body); rej != nil {
		return nil, rej
	}
	if d.job != nil {
		d.job.id, d.job.typ = d.id, d.typ
	}
	return d, nil
}

// webhookClaims are the claims of a delivery's token beyond the standard
// ones go-oidc checks.
type webhookClaims struct {
	ID      string `json:"jti"`
	Webhook struct {
		Digest string `json:"digest"`
	} `json:"webhook"`
}

// verifyToken checks that the token was issued by the vendor, for this
// receiver's groups, recently, and for this very body. It returns what
// identifies the token and until when the token could verify.
func (r *Receiver) verifyToken(ctx context.Context, raw string, body []byte) (string, time.Time, *rejection) {
	verifier, err := r.getVerifier(ctx)
	if err != nil {
		r.log.Warn("cannot verify pushed events", "err", err)
		return "", time.Time{}, refusal(
			http.StatusServiceUnavailable,
			ReasonUnavailable,
			"the token issuer cannot be reached; retry later",
		)
	}
	// Verify checks the signature, issuer, audience and exp.
	tok, err := verifier.Verify(ctx, raw)
	if err != nil {
		var expired *oidc.TokenExpiredError
		if errors.As(err, &expired) {
			return "", time.Time{}, refusal(
				http.StatusForbidden,
				ReasonExpiredToken,
				"the token expired at %s",
				expired.Expiry.UTC().Format(time.RFC3339),
			)
		}
		r.log.Debug("token verification failed", "err", err)
		return "", time.Time{}, refusal(http.StatusForbidden, ReasonBadToken, "the token did not verify")
	}
	group, ok := strings.CutPrefix(tok.Subject, "webhook:")
	if !ok || !r.groups[group] {
		return "", time.Time{}, refusal(
			http.StatusForbidden,
			ReasonWrongSubject,
			"the token's subject is not a subscribed group",
		)
	}
	var claims webhookClaims
	sum := sha256.Sum256(body)
	digest := "sha256:" + hex.EncodeToString(sum[:])
	if err := tok.Claims(&claims); err != nil || claims.Webhook.Digest != digest {
		return "", time.Time{}, refusal(
			http.StatusForbidden,
			ReasonBadDigest,
			"the token's webhook digest does not match the body",
		)
	}
	end, rej := r.checkIssued(tok)
	if rej != nil {
		return "", time.Time{}, rej
	}
	if claims.ID != "" {
		return "jti:" + claims.ID, end, nil
	}
	// Without a jti, a token is known by what it signs and when: the
	// platform signs every attempt anew, so two tokens for one body differ
	// in iat unless they were issued in the same second.
	return "iat:" + strconv.FormatInt(tok.IssuedAt.Unix(), 10) + ":" + digest, end, nil
}

// checkIssued refuses a token without an issue time, issued in the future,
// or issued longer ago than MaxTokenAge, each give or take ClockSkew. It
// returns when the token stops being acceptable: at its exp, or when it
// becomes too old, whichever is first.
func (r *Receiver) checkIssued(tok *oidc.IDToken) (time.Time, *rejection) {
	now, skew := r.cfg.Now(), r.cfg.ClockSkew
	iat := tok.IssuedAt
	switch {
	case iat.IsZero():
		return time.Time{}, refusal(http.StatusForbidden, ReasonBadToken, "the token has no iat (issue time)")
	case iat.After(now.Add(skew)):
		return time.Time{}, refusal(
			http.StatusForbidden,
			ReasonBadToken,
			"the token's iat is %s ahead of this receiver's clock",
			iat.Sub(now).Round(time.Second),
		)
	case now.Sub(iat) > r.cfg.MaxTokenAge+skew:
		return time.Time{}, refusal(
			http.StatusForbidden,
			ReasonTokenTooOld,
			"the token was issued %s ago; at most %s is accepted",
			now.Sub(iat).Round(time.Second),
			r.cfg.MaxTokenAge,
		)
	}
	end := iat.Add(r.cfg.MaxTokenAge + skew)
	if tok.Expiry.Before(end) {
		end = tok.Expiry
	}
	return end, nil
}
