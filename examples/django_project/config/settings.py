"""Settings of the example project: PostgreSQL from ``PGWORK_DSN``, and pgwork as the
backend of Django's task framework (``django.tasks`` on Django 6.0+, the
``django-tasks`` backport before it)."""

import importlib.util
import os

from psycopg.conninfo import conninfo_to_dict

SECRET_KEY = "example-only-use-your-own"
DEBUG = True
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"
USE_TZ = True

INSTALLED_APPS = ["pgwork.contrib.django", "signups"]
if importlib.util.find_spec("django.tasks") is None:  # Django before 6.0
    INSTALLED_APPS.append("django_tasks")
MIDDLEWARE = ["django.middleware.csrf.CsrfViewMiddleware"]

_db = conninfo_to_dict(os.environ.get("PGWORK_DSN", "postgresql://localhost/app"))
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",  # on psycopg 3, which pgwork needs
        "NAME": _db.get("dbname", ""),
        "USER": _db.get("user", ""),
        "PASSWORD": _db.get("password", ""),
        "HOST": _db.get("host", ""),
        "PORT": _db.get("port", ""),
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Tasks are jobs in pgwork's tables of this same database: `task.enqueue()` writes one on
# Django's connection, in the transaction open there. `manage.py pgwork_worker` runs them.
TASKS = {
    "default": {
        "BACKEND": "pgwork.contrib.django.PgworkBackend",
        "OPTIONS": {"MAX_ATTEMPTS": 3},
    }
}

# The welcome email goes to the worker's output here; set your own email backend.
EMAIL_BACKEND = "django.core.mail.backends.console.EmailBackend"
DEFAULT_FROM_EMAIL = "hello@example.com"
