"""The documented import path of the web dashboard (``from pyscheduler.dashboard import
make_app``): it lives in ``pyscheduler.web.dashboard``."""

from ..web.dashboard import Dashboard, make_app, mask_json, mask_url, serve

__all__ = ["Dashboard", "make_app", "mask_json", "mask_url", "serve"]
