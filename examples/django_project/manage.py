#!/usr/bin/env python
"""The example project's ``manage.py``, as ``django-admin startproject`` writes it.

    cd examples/django_project
    export PGWORK_DSN=postgresql://localhost/app
    python manage.py pgwork_migrate   # pgwork's schema (its jobs table)
    python manage.py migrate          # the project's own tables
    python manage.py runserver        # POST /signups/ saves a signup and enqueues its task
    python manage.py pgwork_worker    # runs the tasks, until SIGTERM or Ctrl-C

The pieces: ``config/settings.py`` (pgwork as the backend of Django's task framework),
``signups/tasks.py`` (a plain ``def`` task on the ORM), ``signups/views.py`` (the
signup and its task in one transaction). ``tests/docs/test_example_django.py`` runs all
of the above.
"""

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
