"""The web dashboard: ``make_app(dsn, ...)`` is a WSGI application (``pages.Dashboard``);
``serve`` runs it on pyscheduler's bounded HTTP server (``pyscheduler dashboard``). Its parts:
``http`` (routing and the protections), ``pages``, ``formatting``, ``charts``, ``data``
(every query), ``cli``, ``templates/``."""

from ...masking import mask_url
from ..server import serve
from .formatting import mask_json
from .pages import Dashboard, make_app

__all__ = ["Dashboard", "make_app", "mask_json", "mask_url", "serve"]
