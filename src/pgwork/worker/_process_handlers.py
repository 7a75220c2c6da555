"""CPU-bound handlers: what the worker calls in their place, and what is refused when
the worker is built.

A process handler is a plain function of the job's input, ``def handler(input) ->
output``, run in one of the worker's processes (``_processes``). To the rest of the
worker it is an async handler like any other: ``on_processes`` turns it into one, so
the middlewares, the steps of an attempt, its timeout, its lease renewal and the
outcome's write are the same code for every handler. The handler and the job type's
models go to the process pickled by reference, checked once, when the worker is built
(``process_call``): a lambda, a nested function or a model defined inside a function
is refused then, not when its first job runs.
"""

from __future__ import annotations

import functools
import inspect
import json
import pickle
import sys
from collections.abc import Callable
from typing import Any

from pgwork.errors import ProcessHandlerError
from pgwork.job_types import JobType
from pgwork.worker._attempt import Attempt
from pgwork.worker._child import request
from pgwork.worker._handlers import is_async_callable
from pgwork.worker._processes import HandlerProcesses
from pgwork.worker.middleware import CallNext

__all__ = ["ProcessHandler", "RemoteTraceback", "on_processes", "process_call"]

ProcessHandler = Callable[[Any], Any]

_BY_REFERENCE = (
    "define it with `def` at the top level of a module the worker's processes can import "
    "(not a lambda, a nested function or a method of a class defined in a function)"
)


class RemoteTraceback(Exception):
    """The traceback of an exception raised in a handler's process: set as the
    ``__cause__`` of the exception the attempt fails with, so the stored traceback
    shows where in the handler it was raised."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return f"raised in the handler's process:\n{self.text}"


def process_call(job_type: JobType[Any, Any], handler: object) -> bytes:
    """``(handler, input model, output model)`` pickled for the handler's processes;
    ``ProcessHandlerError`` for a handler (or a model) that cannot run there."""
    name = job_type.name
    if job_type.mode == "atomic":
        raise ProcessHandlerError(
            name,
            handler,
            "is for an atomic job type (mode='atomic'), whose attempt writes in the job's "
            "transaction on the worker's connection, which another process cannot use: give "
            "the type an async handler in processors, or make it staged (mode='staged')",
        )
    if not callable(handler):
        raise ProcessHandlerError(name, handler, f"is not callable: {_BY_REFERENCE}")
    if is_async_callable(handler):
        raise ProcessHandlerError(
            name,
            handler,
            "is an async function: a process handler is a plain `def` that computes its "
            "output from its input. Give an async handler in processors instead",
        )
    target: Any = handler
    while isinstance(target, functools.partial):
        target = target.func
    if inspect.isgeneratorfunction(target) or inspect.isasyncgenfunction(target):
        raise ProcessHandlerError(
            name, handler, "is a generator function: a handler returns its output (or raises)"
        )
    _check_by_reference(name, handler, handler, "it")
    models = (job_type.input_model, job_type.output_model)
    for what, model in zip(("input", "output"), models, strict=True):
        _check_by_reference(name, handler, model, f"its {what} model {model!r}")
    return pickle.dumps((handler, *models))


def _check_by_reference(type_name: str, handler: object, value: object, whose: str) -> None:
    try:
        pickle.dumps(value)
    except Exception as exc:
        raise ProcessHandlerError(
            type_name,
            handler,
            f"cannot run in another process: {whose} cannot be pickled by "
            f"reference ({exc}); {_BY_REFERENCE}",
        ) from None
    target: Any = value
    while isinstance(target, functools.partial):
        target = target.func
    module_name = getattr(target, "__module__", None)
    if not isinstance(module_name, str):
        return
    module = sys.modules.get(module_name)
    if module is None or _importable(module):
        return
    raise ProcessHandlerError(
        type_name,
        handler,
        f"cannot run in another process: {whose} is defined in {module_name!r}, "
        "a module that was not imported from a file, which a new process cannot import; "
        f"{_BY_REFERENCE}",
    )


def _importable(module: Any) -> bool:
    if getattr(module, "__spec__", None) is not None:
        return True
    # A script run as ``python script.py``: a spawned process runs it again (as
    # ``__mp_main__``, its ``if __name__ == "__main__":`` block skipped).
    return module.__name__ == "__main__" and getattr(module, "__file__", None) is not None


def on_processes(
    handler: object,
    processes: HandlerProcesses,
    job_type: JobType[Any, Any],
    call: bytes,
    max_bytes: int,
) -> CallNext:
    """The awaitable the worker calls for the process ``handler``: it sends the job's
    input to one of ``processes`` and returns the output that came back (decoded with
    the type's output model), or raises what the handler raised there.

    Interrupted (the attempt's timeout, its job cancelled, its lease lost, the worker
    stopping), the process is killed and waited for, then the cancellation goes on:
    the attempt ends as an interrupted async handler's does."""
    type_name = job_type.name
    inputs = job_type.input_codec
    outputs = job_type.output_codec

    async def run(attempt: Attempt[Any, Any]) -> Any:
        message = request(
            type_name=type_name,
            call=call,
            # Stored inputs were limited when they were written.
            input_json=inputs.encode(attempt.job.input, max_bytes=sys.maxsize),
            max_bytes=max_bytes,
        )
        answer = pickle.loads(await processes.run(message, type_name=type_name))
        tag = answer[0]
        if tag == "ok":
            return outputs.decode(json.loads(answer[1]))
        error: BaseException
        if tag == "raised":
            _, error, text = answer
        elif tag == "unpicklable":
            _, path, shown, text, why = answer
            error = ProcessHandlerError(
                type_name,
                handler,
                f"raised {path}: {shown}, an exception that cannot be sent back from its "
                f"process ({why}). Give the exception class an __init__ that takes what "
                "it passes to Exception.__init__, or raise a picklable one",
            )
        else:
            _, why, text = answer
            error = ProcessHandlerError(
                type_name,
                handler,
                f"could not be loaded in the worker's process ({why}): is its module "
                "importable there (on sys.path, without side effects that fail)?",
            )
        raise error from RemoteTraceback(text)

    return run
