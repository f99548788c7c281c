package server

import (
	"github.com/hiloop/hiloop/control/controltest"

	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestOpenAPICoversEveryRoute checks the served document names every route
// the server registers, with its method, and nothing the server lacks.
func TestOpenAPICoversEveryRoute(t *testing.T) {
	s := newTestServer(t, &controltest.Cluster{}).srv
	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, httptest.NewRequest("GET", "/v1/openapi.json", nil))
	if rec.Code != 200 {
		t.Fatalf("GET /v1/openapi.json: %d", rec.Code)
	}
	var doc struct {
		Paths map[string]map[string]any `json:"paths"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	for path, ops := range doc.Paths {
		for method := range ops {
			if method != "parameters" {
				documented[strings.ToUpper(method)+" "+path] = true
			}
		}
	}
	for _, r := range s.Routes() {
		if !documented[r] {
			t.Errorf("route %s is not in the OpenAPI document", r)
		}
		delete(documented, r)
	}
	for r := range documented {
		t.Errorf("OpenAPI documents %s, which the server does not serve", r)
	}
}
