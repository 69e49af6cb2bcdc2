package ports

import (
	_ "embed"
	"encoding/json"
	"fmt"

	"go.yaml.in/yaml/v3"
)

//go:generate go tool oapi-codegen -config oapi-codegen.yml openapi.yml

// OpenAPIYAML is the API's contract, ports/openapi.yml, as served at GET /openapi.yaml.
//
//go:embed openapi.yml
var OpenAPIYAML []byte

// OpenAPIJSON is the contract as JSON (GET /openapi.json): the YAML with its anchors expanded.
func OpenAPIJSON() ([]byte, error) {
	var doc any
	if err := yaml.Unmarshal(OpenAPIYAML, &doc); err != nil {
		return nil, fmt.Errorf("ports: openapi.yml: %w", err)
	}
	b, err := json.Marshal(doc)
	if err != nil {
		return nil, fmt.Errorf("ports: openapi.yml as JSON: %w", err)
	}
	return b, nil
}
