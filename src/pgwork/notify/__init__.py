"""Notify adapters on message brokers, each behind an extra of its own.

``pgwork.notify.redis.RedisNotifyAdapter`` (``pgwork[redis]``) and
``pgwork.notify.nats.NatsNotifyAdapter`` (``pgwork[nats]``) take the wake-ups off
PostgreSQL: no ``NOTIFY`` in the enqueuing transaction (whose commit PostgreSQL
serialises across the cluster), and hints that let only as many workers look as there
are new jobs. Import them from their modules: this package imports neither client.
"""
