"""The test app's table: rows the tasks write, so a test can count a task's effect."""

from __future__ import annotations

from django.db import models


class Effect(models.Model):
    key = models.CharField(max_length=200)
    data = models.JSONField(default=dict)

    class Meta:
        app_label = "taskapp"
