"""SIGTERM as a preemption notice: the commands that write a run (``sera-train``, ``sera-ablate``,
``sera-warmstart``) take it down the path Ctrl-C takes — the running task is cancelled, the loop saves on its way
out — and exit 143 (128 + SIGTERM, what schedulers expect of a process that ended on their signal) with one line.

Clusters send SIGTERM before they preempt (SLURM, Kubernetes, torchrun's elastic agent), a grace period before
SIGKILL. Python's default for SIGTERM is to die at once, without running ``finally`` blocks: no checkpoint. Here the
handler calls whatever SIGINT handler is installed at that moment: inside ``asyncio.run`` that is asyncio's, which
cancels the main task (the loop's ``finally`` saves) and makes ``asyncio.run`` raise ``KeyboardInterrupt``;
outside it, Python's default, which raises ``KeyboardInterrupt`` where the main thread is. A second signal of
either kind raises at once, as a second Ctrl-C does.

In a multi-process job the training loop routes both signals to its agreed stop instead (``training.build``): the
processes stop together at one step's exchange and save together (a process unwinding on its own would leave its
peers waiting in a collective).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Any

TERMINATED = 143  # 128 + SIGTERM
INTERRUPTED = 130  # 128 + SIGINT

_terminated = False


_direct = False  # raise at once (a command with nothing to save on its way out)


def _on_sigterm(signum: int, frame: Any) -> None:
    global _terminated
    _terminated = True
    if _direct:
        # A main task may finish normally despite asyncio's cancel (one that swallows CancelledError), and then no
        # KeyboardInterrupt would follow: a command with no save to make raises where the main thread is.
        raise KeyboardInterrupt
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler):
        handler(signal.SIGINT, frame)  # asyncio's handler cancels the main task; Python's raises KeyboardInterrupt
    else:
        raise KeyboardInterrupt


def _redeliver_if_swallowed(unraisable: Any) -> None:
    """``sys.unraisablehook``: a KeyboardInterrupt raised by the SIGTERM handler while the main thread ran a
    callback whose exceptions Python ignores (a gc callback such as jax's, a ``__del__``) would be lost and the
    command would run on; the signal is sent again shortly, from a thread, so the handler runs in ordinary code."""
    if _terminated and issubclass(unraisable.exc_type, KeyboardInterrupt):
        threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGTERM)).start()
        return
    _previous_hook(unraisable)


_previous_hook = sys.unraisablehook


def install(*, direct: bool = False) -> None:
    """Makes SIGTERM behave as Ctrl-C for the rest of the process (main thread only); returns None. ``direct``:
    raise ``KeyboardInterrupt`` where the main thread is, even inside ``asyncio.run`` (for a command that saves
    nothing on its way out: the warm start's build)."""
    global _terminated, _direct
    _terminated, _direct = False, direct
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        # A job started in the background by a script inherits SIGINT ignored. asyncio installs its cancelling
        # handler only over Python's default one, and SIGTERM relies on it: without it the KeyboardInterrupt
        # would be raised inside the event loop, whose tasks are then cancelled without the loop's save.
        signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _on_sigterm)
    global _previous_hook
    if sys.unraisablehook is not _redeliver_if_swallowed:
        _previous_hook, sys.unraisablehook = sys.unraisablehook, _redeliver_if_swallowed


def terminated() -> bool:
    """Returns whether the KeyboardInterrupt being handled came from SIGTERM (a preemption) rather than Ctrl-C."""
    return _terminated


def exit_status() -> int:
    """Returns the exit status of a command that ended on a signal: 143 after SIGTERM, 130 after Ctrl-C."""
    return TERMINATED if _terminated else INTERRUPTED


def how() -> str:
    """Returns the words for the signal that ended the command: ``terminated (SIGTERM)`` or ``interrupted``."""
    return "terminated (SIGTERM)" if _terminated else "interrupted"
