"""The dashboard: a web UI to watch and operate queues, chains, jobs and workers.

An optional part of pgwork (``pip install 'pgwork[dashboard]'``): an ASGI app built on
Starlette and Jinja2, rendered on the server, with one small script for live refresh
and every asset served from the package. ``import pgwork`` never imports it.
"""

from pgwork.dashboard._app import create_dashboard
from pgwork.dashboard._origin import LOOPBACK_NAMES
from pgwork.dashboard._security import Authorize, BasicAuth, TokenAuth, allow_any
from pgwork.dashboard._throttle import LoginThrottle

__all__ = [
    "LOOPBACK_NAMES",
    "Authorize",
    "BasicAuth",
    "LoginThrottle",
    "TokenAuth",
    "allow_any",
    "create_dashboard",
]
