package server

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"net/http"

	"go.yaml.in/yaml/v3"
)

//go:embed openapi.yaml
var openapiYAML []byte

// OpenAPI returns the API's OpenAPI 3 document as JSON.
func OpenAPI() ([]byte, error) {
	var doc any
	if err := yaml.Unmarshal(openapiYAML, &doc); err != nil {
		return nil, err
	}
	return json.Marshal(jsonable(doc))
}

// jsonable makes a decoded YAML value one JSON can hold: a mapping whose
// keys are not all strings (a response's status, 200) gets string keys.
func jsonable(v any) any {
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			v[k] = jsonable(e)
		}
		return v
	case map[any]any:
		m := make(map[string]any, len(v))
		for k, e := range v {
			m[fmt.Sprint(k)] = jsonable(e)
		}
		return m
	case []any:
		for i, e := range v {
			v[i] = jsonable(e)
		}
		return v
	}
	return v
}

func (s *Server) openapi(w http.ResponseWriter, r *http.Request) {
	doc, err := OpenAPI()
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(doc)
}
