"""The REST API: the app factory, its routes, auth, errors, models and metrics."""
