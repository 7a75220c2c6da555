import json

from django.db import transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from signups.models import Signup
from signups.tasks import send_welcome

try:
    from django.tasks import TaskResultStatus  # Django 6.0+
except ImportError:
    from django_tasks import TaskResultStatus


class PaymentDeclined(Exception):
    pass


def charge_first_month(email: str, card: str) -> None:
    """Stands in for a payment provider's API, which declines the card "declined"."""
    if card == "declined":
        raise PaymentDeclined(f"the card of {email} was declined")


@csrf_exempt  # JSON only: a browser sends that to another site only after a CORS preflight
@require_POST
def signup(request: HttpRequest) -> JsonResponse:
    if request.content_type != "application/json":
        return JsonResponse({"error": "send JSON"}, status=415)
    body = json.loads(request.body)
    try:
        # The signup and its task commit together when the block ends, or, if anything
        # in it raises, neither exists: the task is written on Django's connection, in
        # this transaction. (ATOMIC_REQUESTS does the same for a whole view, but only for
        # an exception that leaves the view: one caught there commits.)
        with transaction.atomic():
            new = Signup.objects.create(email=body["email"])
            welcome = send_welcome.enqueue(new.pk)
            charge_first_month(new.email, body.get("card", ""))
    except PaymentDeclined as declined:
        return JsonResponse({"error": str(declined)}, status=402)
    return JsonResponse({"signup": new.pk, "task": welcome.id}, status=201)


@require_GET
def welcome(request: HttpRequest, task_id: str) -> JsonResponse:
    """Where the welcome task stands: READY, RUNNING, SUCCESSFUL (with what it
    returned) or FAILED."""
    result = send_welcome.get_result(task_id)
    answer = {"status": result.status}
    if result.status == TaskResultStatus.SUCCESSFUL:
        answer["return_value"] = result.return_value
    return JsonResponse(answer)
