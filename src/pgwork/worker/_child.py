"""What runs in a handler process: ``serve`` answers calls, one at a time.

A call names the handler and the job type's models (pickled by reference, so the
process imports them from their modules) and carries the input as the JSON the database
stores. The process decodes it with the input model, calls the handler, and encodes
what it returned with the output model, with pgwork's codec (``Codec``): so the
handler sees what any handler of the type sees, and what comes back is what the
database will store, refused here (``PayloadValidationError``,
``PayloadNotSerializableError``, ...) if it cannot be. No database access from here.

A process loads the worker's handlers (imports their modules) as it starts, before it
says it is ready (``READY``): the worker waits for that before it takes a job, so an
attempt's timeout never pays for an interpreter's start or a module's import. A
handler that cannot be loaded there is tried again by its call, which fails with why.

An exception the handler raised goes back pickled, with its traceback as text; one
that cannot be pickled goes back as its type, message and traceback.
"""

from __future__ import annotations

import contextlib
import json
import pickle
import signal
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from pgwork.payload import Codec

__all__ = ["READY", "Loaded", "request", "serve"]

Loaded = tuple[Callable[[Any], Any], Codec[Any], Codec[Any]]

# What a process sends once it has loaded the handlers it was started with.
READY = b"ready"


def request(*, type_name: str, call: bytes, input_json: str, max_bytes: int) -> bytes:
    """One call for ``serve``: ``call`` is the pickled ``(handler, input model, output
    model)``, made once per job type when the worker is built."""
    return pickle.dumps((type_name, call, input_json, max_bytes))


def serve(conn: Connection, calls: tuple[tuple[str, bytes], ...] = ()) -> None:
    """Load the handlers of ``calls`` (``(type name, call)``), say ``READY``, then
    answer calls on ``conn`` until the worker closes it."""
    # Ctrl-C and a service manager's SIGTERM reach the whole process group: the worker
    # decides what happens to its attempts (it kills this process when it must).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    loaded: dict[bytes, Loaded] = {}
    for type_name, call in calls:
        # One that fails is loaded again by its first call, which reports why.
        with contextlib.suppress(Exception):
            _load(type_name, call, loaded)
    try:
        conn.send_bytes(READY)
        while True:
            message = conn.recv_bytes()
            conn.send_bytes(_answer(message, loaded))
    except (EOFError, OSError):
        return  # the worker closed its end: it stopped, or no longer needs this one


def _load(type_name: str, call: bytes, loaded: dict[bytes, Loaded]) -> Loaded:
    handler = loaded.get(call)
    if handler is None:
        fn, input_model, output_model = pickle.loads(call)
        handler = loaded[call] = (
            fn,
            Codec(input_model, type_name=type_name, what="input"),
            Codec(output_model, type_name=type_name, what="output"),
        )
    return handler


def _answer(message: bytes, loaded: dict[bytes, Loaded]) -> bytes:
    type_name, call, input_json, max_bytes = pickle.loads(message)
    try:
        fn, inputs, outputs = _load(type_name, call, loaded)
    except Exception as exc:
        return pickle.dumps(("unloadable", repr(exc), _traceback(exc)))
    try:
        output = fn(inputs.decode(json.loads(input_json)))
        return pickle.dumps(("ok", outputs.encode(output, max_bytes=max_bytes)))
    except Exception as exc:
        return _raised(exc)


def _raised(exc: Exception) -> bytes:
    text = _traceback(exc)
    try:
        answer = pickle.dumps(("raised", exc, text))
        pickle.loads(answer)  # what cannot be rebuilt over there fails here instead
    except Exception as why:
        kind = type(exc)
        return pickle.dumps(
            ("unpicklable", f"{kind.__module__}.{kind.__qualname__}", str(exc), text, repr(why))
        )
    return answer


def _traceback(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc))
