package admin

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/fleetgate/fleetgate/gateway"
)

// The errors a Credentials implementation wraps to answer other than 500.
var (
	// ErrNoCredentials answers 404: the devices file does not list the
	// device.
	ErrNoCredentials = errors.New("not in the devices file")
	// ErrBadCredentials answers 400: the secrets given cannot be stored
	// (a bad key, a password bcrypt cannot hash, a file that would not
	// load).
	ErrBadCredentials = errors.New("invalid credentials")
)

// maxPasswordLen is the longest password bcrypt hashes (it ignores the
// bytes after).
const maxPasswordLen = 72

// Credentials edits the devices file of a running gateway and reloads
// it (POST and DELETE /v1/credentials/{id}, listen.admin.credentials_api).
// Errors wrapping ErrNoCredentials answer 404, ErrBadCredentials 400.
type Credentials interface {
	// PutCredentials adds device with the secrets of req, or replaces
	// those it gives of a device the file lists (a rotation).
	PutCredentials(device gateway.DeviceID, req CredentialRequest) (CredentialResult, error)
	// DeleteCredentials removes device from the file.
	DeleteCredentials(device gateway.DeviceID) error
}

// CredentialRequest is the body of POST /v1/credentials/{id}: at least
// one secret, or a lease alone (a device already listed: its secrets
// stay).
type CredentialRequest struct {
	// PSK is "generate" (the gateway makes a random 32-byte key and
	// answers it once) or a key in the devices file's form ("hex:..",
	// "base64:..", "text:..").
	PSK string `json:"psk,omitempty"`
	// Password is the MQTT password in clear (the gateway stores its
	// bcrypt hash); PasswordBcrypt a hash made elsewhere. One or none.
	Password       string `json:"password,omitempty"`
	PasswordBcrypt string `json:"password_bcrypt,omitempty"`
	// Lease is the device's own lease, a duration such as "2h" (within
	// presence.lease and presence.max_lease), or "none" to remove it;
	// empty leaves it as it is. The provisioner judges it, with the
	// devices file's own rules (ErrBadCredentials).
	Lease string `json:"lease,omitempty"`
}

// GeneratePSK is CredentialRequest.PSK asking for a generated key.
const GeneratePSK = "generate"

// maxCredentialBody bounds the body of POST /v1/credentials/{id}.
const maxCredentialBody = 16 << 10

// CredentialResult is the answer of POST /v1/credentials/{id}.
type CredentialResult struct {
	Device gateway.DeviceID `json:"device"`
	// Created: the device was added (201); else its secrets were
	// replaced (200).
	Created bool `json:"created"`
	// PSK is the generated key, answered this once; empty unless asked.
	PSK string `json:"psk,omitempty"`
}

// DecodeCredentialRequest reads a CredentialRequest: one JSON object of
// the known fields, with at least one secret and not both passwords. Its
// errors never quote a secret.
func DecodeCredentialRequest(r io.Reader) (CredentialRequest, error) {
	var req CredentialRequest
	dec := json.NewDecoder(io.LimitReader(r, maxCredentialBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		var se *json.SyntaxError
		var te *json.UnmarshalTypeError
		switch {
		case errors.As(err, &se), errors.As(err, &te), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
			return req, errors.New("body: want a JSON object with psk, password, password_bcrypt or lease")
		}
		return req, fmt.Errorf("body: %w", err) // an unknown field names the field only
	}
	if dec.More() {
		return req, errors.New("body: one JSON object, nothing after it")
	}
	switch {
	case req.PSK == "" && req.Password == "" && req.PasswordBcrypt == "" && req.Lease == "":
		return req, errors.New("body: no secret: give psk (\"generate\" or a key), password or password_bcrypt (or lease alone, for a listed device)")
	case req.Password != "" && req.PasswordBcrypt != "":
		return req, errors.New("body: password and password_bcrypt: give one")
	case len(req.Password) > maxPasswordLen:
		return req, fmt.Errorf("body: the password is %d bytes, bcrypt takes at most %d", len(req.Password), maxPasswordLen)
	}
	return req, nil
}

// mutating wraps a handler that changes state: it is refused (403)
// unless the API has a bearer token (which secure then checked).
func (s *Server) mutating(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if s.o.Token == "" {
			writeError(w, http.StatusForbidden, errors.New("this request changes state and the admin API has no bearer token: set listen.admin.token_file"))
			return
		}
		h(w, r)
	}
}

// pathDevice is the {id} of a request's path; it answers 400 itself when
// that is not a device ID.
func pathDevice(w http.ResponseWriter, r *http.Request) (gateway.DeviceID, bool) {
	id, err := gateway.ParseDeviceID(r.PathValue("id"))
	if err != nil {
		writeError(w, http.StatusBadRequest, err)
		return "", false
	}
	return id, true
}

// forget serves DELETE /v1/devices/{id}: the store forgets the device
// (gateway.Forgetter); 200 with its removed event, 404 if the store does
// not hold it.
func (s *Server) forget(w http.ResponseWriter, r *http.Request) {
	id, ok := pathDevice(w, r)
	if !ok {
		return
	}
	ev, err := s.o.Forget.Forget(r.Context(), id, s.o.GatewayID)
	switch {
	case errors.Is(err, gateway.ErrNotFound):
		writeError(w, http.StatusNotFound, fmt.Errorf("device %s: %w", id, gateway.ErrNotFound))
	case err != nil:
		writeError(w, http.StatusBadGateway, err)
	default:
		s.o.Logger.Info("device forgotten", "device", id, "ver", ev.Ver)
		writeJSON(w, http.StatusOK, gateway.EnvelopeOf(ev))
	}
}

// putCredentials serves POST /v1/credentials/{id}.
func (s *Server) putCredentials(w http.ResponseWriter, r *http.Request) {
	id, ok := pathDevice(w, r)
	if !ok {
		return
	}
	req, err := DecodeCredentialRequest(r.Body)
	if err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	res, err := s.o.Credentials.PutCredentials(id, req)
	if err != nil {
		writeError(w, credentialStatus(err), err)
		return
	}
	code := http.StatusOK
	if res.Created {
		code = http.StatusCreated
	}
	w.Header().Set("Cache-Control", "no-store") // it may hold a key
	writeJSON(w, code, res)
}

// deleteCredentials serves DELETE /v1/credentials/{id}: 200 with
// {"device": id, "removed": true}, or 404 when the file does not list
// the device.
func (s *Server) deleteCredentials(w http.ResponseWriter, r *http.Request) {
	id, ok := pathDevice(w, r)
	if !ok {
		return
	}
	if err := s.o.Credentials.DeleteCredentials(id); err != nil {
		writeError(w, credentialStatus(err), err)
		return
	}
	writeJSON(w, http.StatusOK, struct {
		Device  gateway.DeviceID `json:"device"`
		Removed bool             `json:"removed"`
	}{id, true})
}

func credentialStatus(err error) int {
	switch {
	case errors.Is(err, ErrNoCredentials):
		return http.StatusNotFound
	case errors.Is(err, ErrBadCredentials):
		return http.StatusBadRequest
	}
	return http.StatusInternalServerError
}
