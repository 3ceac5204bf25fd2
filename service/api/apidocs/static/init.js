// Swagger UI over this service's own OpenAPI document. Everything it loads comes from this
// origin (the page's Content-Security-Policy allows nothing else); the online validator is
// off, so the page never calls another host.
window.ui = SwaggerUIBundle({
  url: "/schema/openapi.json",
  dom_id: "#swagger-ui",
  deepLinking: true,
  validatorUrl: null,
  presets: [SwaggerUIBundle.presets.apis],
  layout: "BaseLayout",
});
