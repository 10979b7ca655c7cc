package kvroute

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"net/http"
	"strings"
)

const (
	cookieIDBytes = 16
	cookieIDLen   = 22 // base64url of 16 bytes, unpadded
	cookieMACLen  = 43 // base64url of a SHA-256 HMAC, unpadded
)

// SessionCookie configures cookie-based session affinity.
type SessionCookie struct {
	// Name of the cookie. Default: kvroute_session.
	Name string `json:"name,omitempty"`
	// Secret signs the cookie (HMAC-SHA256) so that a client cannot choose its session id;
	// placeholders such as {env.KVROUTE_COOKIE_SECRET} are replaced at load time, and the
	// config is refused when a given secret resolves to fewer than 16 bytes (make one with
	// `openssl rand -base64 32`). Without it the cookie is an unsigned random id. Replicas of
	// one fleet must share it.
	Secret string `json:"secret,omitempty"`
}

// cookieCodec makes and checks session cookie values. A value is an opaque random id (never an
// upstream address), followed, when a secret is set, by "." and the id's HMAC.
type cookieCodec struct {
	name   string
	secret []byte
}

// newID returns a fresh session id and the cookie value that carries it.
func (c *cookieCodec) newID() (id, value string) {
	var b [cookieIDBytes]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read does not fail on supported platforms
	id = base64.RawURLEncoding.EncodeToString(b[:])
	return id, c.encode(id)
}

func (c *cookieCodec) encode(id string) string {
	if len(c.secret) == 0 {
		return id
	}
	return id + "." + c.mac(id)
}

func (c *cookieCodec) mac(id string) string {
	h := hmac.New(sha256.New, c.secret)
	h.Write([]byte(id))
	return base64.RawURLEncoding.EncodeToString(h.Sum(nil))
}

// decode returns the session id a cookie value carries, or false when the value is malformed
// or its signature does not verify (compared in constant time).
func (c *cookieCodec) decode(value string) (string, bool) {
	id, sig, signed := strings.Cut(value, ".")
	if len(id) != cookieIDLen || !isBase64URL(id) {
		return "", false
	}
	if len(c.secret) == 0 {
		return id, !signed
	}
	if !signed || len(sig) != cookieMACLen {
		return "", false
	}
	if !hmac.Equal([]byte(sig), []byte(c.mac(id))) {
		return "", false
	}
	return id, true
}

// fromRequest returns the session id of the request's cookie, if it carries a valid one.
func (c *cookieCodec) fromRequest(r *http.Request) (string, bool) {
	ck, err := r.Cookie(c.name)
	if err != nil {
		return "", false
	}
	return c.decode(ck.Value)
}

// set adds the cookie carrying id to the response.
func (c *cookieCodec) set(w http.ResponseWriter, r *http.Request, id string) {
	http.SetCookie(w, &http.Cookie{
		Name:     c.name,
		Value:    c.encode(id),
		Path:     "/",
		HttpOnly: true,
		Secure:   r.TLS != nil,
		SameSite: http.SameSiteLaxMode,
	})
}

func isBase64URL(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}
