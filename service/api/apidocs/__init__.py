"""The interactive API documentation: Swagger UI served from the package, never a CDN."""
