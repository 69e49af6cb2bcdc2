// Package openapitest holds the API's contract to what the service answers in tests: a Validator
// checks every response a test client receives against ports/openapi.yml with kin-openapi's
// response validation, so a test that gets an answer the spec does not describe fails.
package openapitest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"

	"github.com/checkins/checkins/ports"
)

// Load parses and validates the spec (the kin-openapi loader, then Validate).
func Load(ctx context.Context) (*openapi3.T, error) {
	l := openapi3.NewLoader()
	doc, err := l.LoadFromData(ports.OpenAPIYAML)
	if err != nil {
		return nil, fmt.Errorf("openapi.yml does not load: %w", err)
	}
	if err := doc.Validate(ctx); err != nil {
		return nil, fmt.Errorf("openapi.yml is not valid OpenAPI: %w", err)
	}
	return doc, nil
}

// Validator checks responses against the spec.
type Validator struct {
	doc    *openapi3.T
	router routers.Router

	mu         sync.Mutex
	checked    int
	mismatches []string
}

// New loads the spec; its server list is replaced by "/" so that requests to any test address
// find their route.
func New() (*Validator, error) {
	doc, err := Load(context.Background())
	if err != nil {
		return nil, err
	}
	doc.Servers = openapi3.Servers{{URL: "/"}}
	// The spec's text answers (the page, its files, the YAML, metrics) are checked as strings.
	for _, mt := range []string{"text/html", "text/css", "text/javascript", "application/yaml", "application/openmetrics-text"} {
		openapi3filter.RegisterBodyDecoder(mt, openapi3filter.FileBodyDecoder)
	}
	r, err := gorillamux.NewRouter(doc)
	if err != nil {
		return nil, err
	}
	return &Validator{doc: doc, router: r}, nil
}

// MustNew is New for package-level test clients.
func MustNew() *Validator {
	v, err := New()
	if err != nil {
		panic(err)
	}
	return v
}

// Check validates one response (status, headers, body) to req. A path or method the spec does
// not have must be answered 404 or 405 with the API's error body.
// HEAD on a GET route (the spec's description says every one answers it) is checked as that
// GET without its body, and must have none.
func (v *Validator) Check(req *http.Request, status int, header http.Header, body []byte) error {
	ctx := context.Background()
	head := req.Method == http.MethodHead
	if head {
		if len(body) > 0 {
			return fmt.Errorf("HEAD %s answered %d with a body %s", req.URL.Path, status, truncate(body))
		}
		get := req.Clone(ctx)
		get.Method = http.MethodGet
		req = get
	}
	route, params, err := v.router.FindRoute(req)
	if errors.Is(err, routers.ErrPathNotFound) || errors.Is(err, routers.ErrMethodNotAllowed) {
		if head && status >= 400 && header.Get(ports.HeaderCorrelationID) != "" {
			return nil // the error a GET would have had, without its body
		}
		return v.checkUnrouted(req, status, header, body)
	}
	if err != nil {
		return fmt.Errorf("%s %s: no route in openapi.yml: %w", req.Method, req.URL.Path, err)
	}
	in := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route},
		Status:                 status,
		Header:                 header,
		Body:                   io.NopCloser(bytes.NewReader(body)),
		Options:                &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true, ExcludeResponseBody: head},
	}
	if err := openapi3filter.ValidateResponse(ctx, in); err != nil {
		return fmt.Errorf("%s %s answered %d, which openapi.yml does not describe: %w (body %s)",
			req.Method, req.URL.Path, status, err, truncate(body))
	}
	return nil
}

// checkUnrouted: outside the spec's routes the service answers 404 or 405 with the error body
// and the correlation ID.
func (v *Validator) checkUnrouted(req *http.Request, status int, header http.Header, body []byte) error {
	switch {
	case req.Method == http.MethodOptions && status < 300:
		// Echo answers OPTIONS on any route (204, Allow), the CORS middleware a preflight.
		if len(body) > 0 {
			return fmt.Errorf("OPTIONS %s answered %d with a body %s", req.URL.Path, status, truncate(body))
		}
		return nil
	case status < 400:
		// A route the test itself added to the server (the service's own routes are the spec's:
		// TestOpenAPIRoutesAreTheServicesRoutes); not part of the contract.
		return nil
	case status == http.StatusRequestHeaderFieldsTooLarge:
		return nil // net/http's own plain-text answer, before any route
	}
	if header.Get(ports.HeaderCorrelationID) == "" {
		return fmt.Errorf("%s %s answered %d without %s", req.Method, req.URL.Path, status, ports.HeaderCorrelationID)
	}
	schema := v.doc.Components.Schemas["ErrorBody"].Value
	var doc any
	if err := json.Unmarshal(body, &doc); err != nil {
		return fmt.Errorf("%s %s answered %d with a body that is not JSON: %w (body %s)", req.Method, req.URL.Path, status, err, truncate(body))
	}
	if err := schema.VisitJSON(doc); err != nil {
		return fmt.Errorf("%s %s answered %d with a body that is not the error body: %w", req.Method, req.URL.Path, status, err)
	}
	return nil
}

// Transport wraps next so that every response is validated (its body read and put back); a
// response that does not match the spec makes RoundTrip fail with the mismatch, and is kept for
// Err.
func (v *Validator) Transport(next http.RoundTripper) http.RoundTripper {
	if next == nil {
		next = http.DefaultTransport
	}
	return transport{v: v, next: next}
}

// Client is an http.Client with a validating transport over next (nil: the default transport).
func (v *Validator) Client(next http.RoundTripper) *http.Client {
	return &http.Client{Transport: v.Transport(next)}
}

// Err reports every mismatch seen so far, for TestMain: a test that ignored its client's error
// still fails the run.
func (v *Validator) Err() error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if len(v.mismatches) == 0 {
		return nil
	}
	return fmt.Errorf("%d of %d responses did not match openapi.yml:\n%s", len(v.mismatches), v.checked, strings.Join(v.mismatches, "\n"))
}

// Checked is the number of responses validated so far.
func (v *Validator) Checked() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.checked
}

type transport struct {
	v    *Validator
	next http.RoundTripper
}

func (t transport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.next.RoundTrip(req)
	if err != nil {
		return resp, err
	}
	if isStream(resp) {
		return resp, nil // an event stream never ends: its status and headers are all there is to check
	}
	body, rerr := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	resp.Body = io.NopCloser(bytes.NewReader(body))
	if rerr != nil {
		return resp, nil // the caller sees the same short body; a timeout is its own failure
	}
	verr := t.v.Check(req, resp.StatusCode, resp.Header, body)
	t.v.mu.Lock()
	t.v.checked++
	if verr != nil {
		t.v.mismatches = append(t.v.mismatches, verr.Error())
	}
	t.v.mu.Unlock()
	if verr != nil {
		return nil, verr
	}
	return resp, nil
}

func isStream(resp *http.Response) bool {
	return strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream")
}

func truncate(b []byte) string {
	if len(b) > 300 {
		return fmt.Sprintf("%q...", b[:300])
	}
	return fmt.Sprintf("%q", b)
}
