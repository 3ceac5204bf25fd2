"""The dashboard of SPEC section 8: one static page and a few ES modules (static/), served
by the API process under /dashboard with a strict Content-Security-Policy. The page calls
the REST API from the browser with the token the person pastes; the server side only serves
files."""

from service.api.dashboard.routes import HANDLERS

__all__ = ["HANDLERS"]
