"""SIGTERM stops a run as Ctrl-C does.

Schedulers stop a job with SIGTERM (Slurm at its time limit, ``timeout``,
Kubernetes). Within ``sigterm_interrupts`` (the command line runs every command
in it) SIGTERM raises ``Terminated``, a ``KeyboardInterrupt``: every cleanup that
runs on Ctrl-C runs (``results.writer`` removes its ``NAME.partial`` and leaves
an earlier result as it was; a study gives its batch back).

An exception raised by a signal handler can be lost: the handler runs in
whatever Python code the main thread is in, and C code that calls Python and
clears any error (numba's dispatcher probing an argument's attributes) drops
it. So the signal is also recorded, and loops call ``raise_if_terminated``
between chunks and before publishing a result: a lost ``Terminated`` is raised
again there, never a result published after the signal.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread (``sigterm_interrupts``)."""


#: SIGTERM arrived within ``sigterm_interrupts`` (reset when it is entered and left)
_received = False


def _on_sigterm(signum: int, frame: Any) -> None:
    global _received
    if _received:  # once: ``timeout`` signals the command, then its process group, and a second
        return  # Terminated would cut the first one's cleanup short (SIGKILL still ends the process)
    _received = True
    raise Terminated


def raise_if_terminated() -> None:
    """Raise ``Terminated`` where SIGTERM arrived but its exception was lost (module doc)."""
    if _received:
        raise Terminated


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """Within the block, SIGTERM raises ``Terminated`` (where a handler can be set: the main thread)."""
    global _received
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _received = False
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        yield
    finally:
        if previous is not None:  # None: a handler set outside Python, which cannot be put back
            signal.signal(signal.SIGTERM, previous)
        _received = False


@contextlib.contextmanager
def deferred_interrupts() -> Iterator[None]:
    """Within the block, Ctrl-C (SIGINT) and SIGTERM are held and raised when it ends
    (``KeyboardInterrupt``, ``Terminated``): for a step that an exception must not cut in
    two, such as starting a local Dask cluster, which left half started cannot be closed
    (distributed's exit hook then fails on it with a traceback). Main thread only."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    hold = lambda signum, frame: held.append(signum)  # noqa: E731
    previous = {sig: signal.signal(sig, hold) for sig in (signal.SIGINT, signal.SIGTERM)}

    def release() -> None:
        """Put the handlers back; raise what was held (the interrupt, not an error it caused:
        the workers a Ctrl-C reached mid-start make the cluster's start fail)."""
        for sig, handler in previous.items():
            if handler is not None:
                signal.signal(sig, handler)
        if signal.SIGTERM in held and previous[signal.SIGTERM] is _on_sigterm:
            _on_sigterm(signal.SIGTERM, None)
        if held:
            raise KeyboardInterrupt

    try:
        yield
    except BaseException:
        release()
        raise
    release()


__all__ = ["Terminated", "deferred_interrupts", "raise_if_terminated", "sigterm_interrupts"]
