"""How a headcount command stops when it is told to: SIGINT (Ctrl-C), SIGTERM (``kill``, ``timeout``, a batch
scheduler) and SIGHUP (a closed terminal) alike.

Python turns SIGINT into :class:`KeyboardInterrupt`; the other two would end the process at once, skipping every
``finally`` (a worker pool left running, staging folders left in the report). :func:`handled` makes them raise
:class:`Stopped`, a ``KeyboardInterrupt`` that names its signal, so one path cleans up after all three and the
exit status says which one came (:func:`exit_status`: 128 + the signal's number, as shells give it: 130, 143, 129).

Worker processes (:func:`worker_init`) leave stopping to their parent: they ignore SIGINT and SIGHUP (a terminal
sends those to its whole foreground process group; the parent ends its workers itself, without a traceback from
each), end at once on SIGTERM, and are killed by the kernel when their parent dies, however it dies
(``PR_SET_PDEATHSIG``: even a SIGKILL of the parent leaves no worker running).
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager

HANDLED = (signal.SIGTERM, signal.SIGHUP)  # SIGINT is Python's own KeyboardInterrupt


class Stopped(KeyboardInterrupt):
    """A SIGTERM or SIGHUP arrived (Ctrl-C stays a plain ``KeyboardInterrupt``).

    Attributes:
        signum: the signal's number.
    """

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def name(exc: BaseException) -> str:
    """The signal that stopped the command: ``SIGTERM``, ``SIGHUP``, or ``SIGINT`` for a plain Ctrl-C."""
    return signal.Signals(getattr(exc, "signum", signal.SIGINT)).name


def exit_status(exc: BaseException) -> int:
    """The exit status of a command stopped by ``exc`` (a ``KeyboardInterrupt`` or :class:`Stopped`): 128 + its signal."""
    return 128 + int(getattr(exc, "signum", signal.SIGINT))


def _raise_stopped(signum, frame) -> None:
    for each in HANDLED:  # a second signal while the first one's cleanup runs would cut that cleanup short
        signal.signal(each, signal.SIG_IGN)
    raise Stopped(signum)


@contextmanager
def handled():
    """Inside it, SIGTERM and SIGHUP raise :class:`Stopped` (the main thread only: elsewhere Python cannot set
    handlers, and nothing is changed); the previous handlers are back afterwards (``main()`` called in a test)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {each: signal.getsignal(each) for each in HANDLED}
    for each, was in previous.items():
        if was is not signal.SIG_IGN:  # started under nohup: SIGHUP stays ignored
            signal.signal(each, _raise_stopped)
    try:
        yield
    finally:
        for each, was in previous.items():
            signal.signal(each, was if was is not None else signal.SIG_DFL)


@contextmanager
def deferred():
    """Inside it, SIGINT, SIGTERM and SIGHUP wait (blocked, not lost): a report's commit runs whole, and the
    signal takes effect once it is done (the command then stops with the report written)."""
    if threading.current_thread() is not threading.main_thread():  # signals go to the main thread: it is not stopped
        yield
        return
    stopping = {signal.SIGINT, *HANDLED}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, stopping)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def start_helper(thread: threading.Thread) -> None:
    """Start ``thread`` with SIGINT, SIGTERM and SIGHUP blocked in it (a thread keeps the signal mask it was started
    with): the kernel then gives them to the main thread, whose handlers stop the command and where :func:`deferred`
    holds them. A signal taken by another thread has its handler run in the main thread at once, inside a deferred
    block too (a report's claim or commit cut short)."""
    with deferred():
        thread.start()


def worker_init() -> None:
    """Set up a worker process of headcount's (a process pool's initializer): its parent decides when it stops."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a forked worker inherits the parent's handler otherwise
    die_with_parent()


PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent ends (Linux ``prctl``).

    Returns:
        Whether it was set (False off Linux, or where the C library cannot be loaded).
    """
    import ctypes
    import os

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if os.getppid() == 1:  # the parent ended before the request was made: nobody will send it
        os.kill(os.getpid(), sig)
    return True
