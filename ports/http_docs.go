package ports

import (
	"embed"
	"net/http"

	"github.com/labstack/echo/v4"
)

// The reference page: Swagger UI (swagger-ui-dist, vendored from npm by docs/vendor/update.sh,
// checked against docs/vendor/swagger-ui-dist/SHA256SUMS), started by docs/docs.js on
// /openapi.json. Everything is embedded: the page works offline.
//
//go:embed docs/index.html docs/docs.js docs/vendor/swagger-ui-dist
var docsFS embed.FS

// DocsCSP is the page's Content-Security-Policy: its own files only, no inline script. Swagger
// UI sets inline styles and shows data: images; "Try it out" calls this origin.
const DocsCSP = "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; " +
	"font-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"

// docsAsset is a file under /docs/assets/: its embedded path and media type.
func docsAsset(name string) (file, mediaType string, ok bool) {
	const js, css, text = "text/javascript; charset=utf-8", "text/css; charset=utf-8", "text/plain; charset=utf-8"
	const vendor = "docs/vendor/swagger-ui-dist/"
	switch name {
	case "docs.js":
		return "docs/docs.js", js, true
	case "swagger-ui-bundle.js":
		return vendor + name, js, true
	case "swagger-ui.css":
		return vendor + name, css, true
	case "LICENSE", "NOTICE":
		return vendor + name, text, true
	}
	return "", "", false
}

// DocsFile is one embedded file of the docs page, e.g. docs/vendor/swagger-ui-dist/LICENSE.
func DocsFile(name string) ([]byte, error) { return docsFS.ReadFile(name) }

// isDocsPath: the document and its page need no token, like the health checks.
func isDocsPath(route string) bool {
	switch route {
	case "/openapi.json", "/openapi.yaml", "/docs", "/docs/assets/:file":
		return true
	}
	return false
}

type docsHandlers struct {
	json    []byte
	jsonErr error
}

func newDocsHandlers() *docsHandlers {
	j, err := OpenAPIJSON()
	return &docsHandlers{json: j, jsonErr: err}
}

func (d *docsHandlers) specJSON(c echo.Context) error {
	if d.jsonErr != nil {
		return d.jsonErr
	}
	c.Response().Header().Set("X-Content-Type-Options", "nosniff")
	return c.Blob(http.StatusOK, echo.MIMEApplicationJSON, d.json)
}

func (d *docsHandlers) specYAML(c echo.Context) error {
	c.Response().Header().Set("X-Content-Type-Options", "nosniff")
	return c.Blob(http.StatusOK, "application/yaml", OpenAPIYAML)
}

func (d *docsHandlers) page(c echo.Context) error {
	b, err := docsFS.ReadFile("docs/index.html")
	if err != nil {
		return err
	}
	h := c.Response().Header()
	h.Set("Content-Security-Policy", DocsCSP)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	return c.HTMLBlob(http.StatusOK, b)
}

func (d *docsHandlers) asset(c echo.Context, name string) error {
	file, mediaType, ok := docsAsset(name)
	if !ok {
		return apiError(http.StatusNotFound, "not_found", "file", "no such file of the docs page: "+name)
	}
	b, err := docsFS.ReadFile(file)
	if err != nil {
		return err
	}
	h := c.Response().Header()
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Cache-Control", "public, max-age=3600")
	return c.Blob(http.StatusOK, mediaType, b)
}
