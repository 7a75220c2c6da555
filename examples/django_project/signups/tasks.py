"""The app's tasks: ``manage.py pgwork_worker`` finds them in this module.

A plain ``def`` task runs on one of the worker's threads, with Django connections of
its own, so it uses the ORM, ``send_mail`` or ``requests`` as a view does.
"""

from django.core.mail import send_mail
from django.utils import timezone

from signups.models import Signup

try:
    from django.tasks import task  # Django 6.0+
except ImportError:
    from django_tasks import task  # the django-tasks backport, on earlier Djangos


@task
def send_welcome(signup_id: int) -> str:
    signup = Signup.objects.get(pk=signup_id)
    send_mail("Welcome!", "Thanks for signing up.", None, [signup.email])
    signup.welcomed_at = timezone.now()
    signup.save(update_fields=["welcomed_at"])
    return f"welcomed {signup.email}"
