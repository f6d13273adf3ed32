"""The web layer: ``server`` (the one bounded HTTP server), ``endpoint`` (each process's
``/metrics``, ``/healthz``, ``/readyz``) and ``dashboard`` (the web dashboard)."""
