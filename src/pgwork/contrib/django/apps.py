"""The Django app of ``pgwork.contrib.django``: add it to INSTALLED_APPS for its
``manage.py`` commands (``pgwork_migrate``, ``pgwork_worker``)."""

from __future__ import annotations

from django.apps import AppConfig

__all__ = ["PgworkConfig"]


class PgworkConfig(AppConfig):  # type: ignore[misc]
    name = "pgwork.contrib.django"
    label = "pgwork"
    verbose_name = "pgwork"
