from django.urls import path
from signups import views

urlpatterns = [
    path("signups/", views.signup),
    path("welcomes/<str:task_id>/", views.welcome),
]
