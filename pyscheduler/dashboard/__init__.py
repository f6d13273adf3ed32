"""The web dashboard (issue 17): ``make_app(dsn, ...)`` is a WSGI application; ``serve``
runs it on pyscheduler's bounded HTTP server (``pyscheduler dashboard``)."""

from .app import Dashboard, make_app, mask_json, mask_url
from .server import serve

__all__ = ["Dashboard", "make_app", "mask_json", "mask_url", "serve"]
