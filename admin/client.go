package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
)

// Client asks a running gateway's admin API; the query commands use it.
type Client struct {
	// Base is "http://127.0.0.1:9180".
	Base string
	HTTP *http.Client
	// token is the bearer token sent (WithAuth).
	token string
}

// ErrUnreachable is returned (wrapped in an *UnreachableError) when
// nothing answers at the client's address.
var ErrUnreachable = errors.New("no gateway answers")

// UnreachableError says where the client looked when nothing answered.
type UnreachableError struct {
	Addr string // "127.0.0.1:9180"
	Err  error
}

func (e *UnreachableError) Error() string {
	return fmt.Sprintf("%v at %s: %v", ErrUnreachable, e.Addr, e.Err)
}

func (e *UnreachableError) Unwrap() []error { return []error{ErrUnreachable, e.Err} }

// NewClient returns a client for the admin listener address addr
// ("127.0.0.1:9180"; an empty or unspecified host means loopback).
func NewClient(addr string) *Client {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	return &Client{Base: "http://" + net.JoinHostPort(host, port), HTTP: &http.Client{Timeout: 10 * time.Second}}
}

// Status reads /v1/status into v (a map or a Status with raw parts).
func (c *Client) Status(ctx context.Context, v any) error {
	return c.get(ctx, "/v1/status", nil, v)
}

// Device reads /v1/devices/{id}.
func (c *Client) Device(ctx context.Context, id string) (json.RawMessage, error) {
	var raw json.RawMessage
	err := c.get(ctx, "/v1/devices/"+url.PathEscape(id), nil, &raw)
	return raw, err
}

// DeviceQuery is the query of GET /v1/devices; an empty field is not
// sent.
type DeviceQuery struct {
	State, Order, Prefix, Protocol, Cursor string
	Limit                                  int
}

// Devices reads one page of /v1/devices.
func (c *Client) Devices(ctx context.Context, dq DeviceQuery) (DevicePage, error) {
	var p DevicePage
	q := pageQuery(dq.State, "cursor", dq.Cursor, dq.Limit)
	for k, v := range map[string]string{"order": dq.Order, "prefix": dq.Prefix, "protocol": dq.Protocol} {
		if v != "" {
			q.Set(k, v)
		}
	}
	err := c.get(ctx, "/v1/devices", q, &p)
	return p, err
}

// Gateways reads /v1/gateways.
func (c *Client) Gateways(ctx context.Context) (GatewayList, error) {
	var l GatewayList
	err := c.get(ctx, "/v1/gateways", nil, &l)
	return l, err
}

// pageQuery is the query of a paged listing: the state filter, the
// position under key, and the page size, each when set.
func pageQuery(state, key, pos string, limit int) url.Values {
	q := url.Values{}
	if state != "" {
		q.Set("state", state)
	}
	if pos != "" {
		q.Set(key, pos)
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	return q
}

// Events reads one page of /v1/events: after cursor, or (cursor "")
// starting since ago.
func (c *Client) Events(ctx context.Context, cursor string, since time.Duration, limit int) (EventPage, error) {
	var p EventPage
	q := url.Values{"limit": {strconv.Itoa(limit)}}
	if cursor != "" {
		q.Set("cursor", cursor)
	} else if since > 0 {
		q.Set("since", since.String())
	}
	err := c.get(ctx, "/v1/events", q, &p)
	return p, err
}

// Error is a non-2xx answer of the API.
type Error struct {
	Code    int
	Message string
	// Token tells whether the request carried a bearer token (what a
	// 401 means).
	Token bool
	// LastRefusal is the last refusal of a device not found (404 of
	// /v1/devices/{id}), when the gateway has one.
	LastRefusal *gateway.Refusal
}

// Final reports whether asking again cannot help: the request was
// refused (4xx: bad, unauthorized, forbidden, not here), not the gateway
// busy or failing (5xx, 408, 429).
func (e *Error) Final() bool {
	return e.Code/100 == 4 && e.Code != http.StatusRequestTimeout && e.Code != http.StatusTooManyRequests
}

// apiError is the Error of an answer with status code and body.
func (c *Client) apiError(code int, body []byte) *Error {
	var ae apiError
	if json.Unmarshal(body, &ae) != nil || ae.Error == "" {
		ae.Error = string(body)
	}
	return &Error{Code: code, Message: ae.Error, Token: c.token != "", LastRefusal: ae.LastRefusal}
}

// Error is the API's message for a request it refused (4xx: the message
// says what was wrong, e.g. "device x: not found"), with the status code
// for a failure of the gateway (5xx).
func (e *Error) Error() string {
	if e.Code/100 == 4 && e.Message != "" {
		return e.Message
	}
	return fmt.Sprintf("admin api: %d: %s", e.Code, e.Message)
}

// request is a GET of u with the client's token.
func (c *Client) request(ctx context.Context, u string) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	return req, nil
}

// Forget asks the gateway to forget device (DELETE /v1/devices/{id}) and
// returns its removed event.
func (c *Client) Forget(ctx context.Context, id string) (gateway.Envelope, error) {
	var env gateway.Envelope
	err := c.do(ctx, http.MethodDelete, "/v1/devices/"+url.PathEscape(id), nil, &env)
	return env, err
}

func (c *Client) get(ctx context.Context, path string, q url.Values, v any) error {
	return c.do(ctx, http.MethodGet, path, q, v)
}

// do sends a request without a body and decodes the answer into v.
func (c *Client) do(ctx context.Context, method, path string, q url.Values, v any) error {
	u := c.Base + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := c.request(ctx, u)
	if err != nil {
		return err
	}
	req.Method = method
	resp, err := c.HTTP.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return &UnreachableError{Addr: strings.TrimPrefix(c.Base, "http://"), Err: err}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("admin api %s: %w", u, err)
	}
	if resp.StatusCode/100 != 2 {
		return c.apiError(resp.StatusCode, body)
	}
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("admin api %s: decode: %w", u, err)
	}
	return nil
}
