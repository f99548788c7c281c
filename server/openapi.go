package server

import (
	_ "embed"
	"net/http"

	"sigs.k8s.io/yaml"
)

//go:embed openapi.yaml
var openapiYAML []byte

// OpenAPI returns the API's OpenAPI 3 document as JSON.
func OpenAPI() ([]byte, error) { return yaml.YAMLToJSON(openapiYAML) }

func (s *Server) openapi(w http.ResponseWriter, r *http.Request) {
	doc, err := OpenAPI()
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(doc)
}
