// Starts Swagger UI on the service's own document. A file of its own rather than an inline
// script, so the page's Content-Security-Policy can refuse every inline script.
window.addEventListener("load", function () {
  window.ui = SwaggerUIBundle({
    url: "/openapi.json",
    dom_id: "#swagger-ui",
    deepLinking: true,
    // No badge that would send the document to an outside validator.
    validatorUrl: null,
    presets: [SwaggerUIBundle.presets.apis],
    layout: "BaseLayout",
    persistAuthorization: false,
  });
});
