"""A second app of the test project: the tasks ``test_django_conformance.py`` runs, the
kinds Django's own task tests run on its backends (a task that returns nothing, one
that raises, one that exits, one whose value JSON cannot hold, ...)."""
