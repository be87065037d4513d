"""The side of ``headcount run`` that lives inside the profiled program.

``headcount run`` puts :mod:`headcount.wrap.autotag` first on the
child's ``PYTHONPATH``; its ``sitecustomize`` calls :func:`install`, which
reads the ``HEADCOUNT_RUN_*`` variables the launcher set and, **once
transformers' modeling code is imported** (so that a Python process that
never builds a model — torchrun's launcher, a data worker — is left alone):

- activates an :class:`~headcount.tagging.tagger.AttentionTagger` in auto
  mode (every ``PreTrainedModel`` that runs is tagged, layer or head mode);
- counts steps: a step starts at each outermost model forward (on the thread
  that runs it) and lasts until the next one; ``step.N`` ranges in the
  ``headcount.step`` domain; with ``HEADCOUNT_RUN_STEPS=A-B`` only steps A..B
  are tagged (and, with ``HEADCOUNT_RUN_CAPTURE=1``, only they are inside
  ``cudaProfilerStart``/``Stop`` for nsys/ncu capture ranges);
- with ``HEADCOUNT_RUN_TAG_SDPA=1`` tags ``F.scaled_dot_product_attention``
  calls made outside transformers (``sdpa.K``: the K-th such call of the step);
- for the cupti backend, runs the in-process collector; for the torch backend, records with torch.profiler
  from the first tagged step to the last (headcount's ranges as ``record_function`` ranges in its trace),
  asking it for PM samples where this torch has a route.

At exit — normal, uncaught exception, SIGTERM or SIGINT (noted by a handler that lets the program unwind, so
the files are written at exit with no lock of the interrupted code held) — it closes what is
open and writes ``<raw>/child-<pid>.pkl``: rank, steps, the call log (the
analytic model needs the shapes), status and notices, and, for cupti, the
records file (cupti) or Chrome trace (torch). ``complete`` is false when the program died.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import sys
import threading
import time
from dataclasses import asdict

from headcount.common.errors import HeadcountError, notice
from headcount.parsers.child_report import CHILD_FILE, ChildReport, calls_to_rows

ENV_PREFIX = "HEADCOUNT_RUN_"


def _env(name: str, default: str = "") -> str:
    return os.environ.get(ENV_PREFIX + name, default)


def parse_steps(text: str) -> tuple[int, int] | None:
    """``"10-12"`` → (10, 12); ``"5"`` → (5, 5); ``""`` → None (all steps).

    Raises:
        ValueError: not a step or a range of steps.
    """
    text = text.strip()
    if not text:
        return None
    lo, _, hi = text.partition("-")
    first, last = int(lo), int(hi or lo)
    if first < 0 or last < first:
        raise ValueError(text)
    return first, last


class ChildSession:
    """One profiled process's state (see the module docstring)."""

    def __init__(self):
        self.raw = _env("DIR")
        self.backend = _env("BACKEND", "nsys")
        self.mode = _env("MODE", "layer")
        self.steps = parse_steps(_env("STEPS"))
        self.capture = _env("CAPTURE") == "1"
        self.tag_sdpa = _env("TAG_SDPA") == "1"
        self.pid = os.getpid()
        self.rank = _int(os.environ.get("RANK"))
        self.local_rank = _int(os.environ.get("LOCAL_RANK"))
        self.world_size = _int(os.environ.get("WORLD_SIZE"))
        self.notices: list[str] = []
        self.tagger = None
        self.recorder = None
        self.torch_trace: str | None = None  # the torch backend's trace, once its recorder stopped
        self.torch_refused = False  # torch.profiler could not start (the program's own profiler runs): not tried again
        self.step_emitter = None
        self.step = -1
        self.step_token = None
        self.step_thread = None
        self.tagging = False
        self.crashed: str | None = None
        self.finished = False
        self.signalled: str | None = None  # "signal SIGINT": what ended the program (its files are written at exit)
        self.resignal: int | None = None  # a signal whose default action ends the process once the files are written
        self._local = threading.local()
        self._pretrained = None
        self._types: dict[type, bool] = {}
        self._sdpa_calls = 0
        self.started = time.time()

    # ------------------------------------------------------------ start
    def start(self) -> None:
        """Called once transformers' modeling code is importable."""
        import torch
        from transformers import PreTrainedModel

        from headcount.common.naming import STEP_DOMAIN
        from headcount.tagging.ranges import CorrelatedEmitter, RangeEmitter
        from headcount.tagging.tagger import AttentionTagger

        self._pretrained = PreTrainedModel
        log = None
        if self.backend == "cupti":
            log = self._start_cupti()
        on_torch = self.backend == "torch"  # its ranges must be record_function ranges: torch.profiler sees no NVTX
        if log is not None:
            self.step_emitter = CorrelatedEmitter(log, domain=STEP_DOMAIN, torch_ranges=False)
        else:
            self.step_emitter = RangeEmitter(domain=STEP_DOMAIN, torch_ranges=on_torch)
        self.tagger = AttentionTagger((), mode=self.mode, auto=True, torch_ranges=on_torch, range_log=log)
        from torch.nn.modules import module as nn_module

        nn_module.register_module_forward_pre_hook(self._pre_forward)
        nn_module.register_module_forward_hook(self._post_forward, always_call=True)
        if self.tag_sdpa:
            self._wrap_sdpa(torch)

    def _start_cupti(self):
        from headcount.collector import cupti_source, pm_sampler

        try:
            kwargs = {}
            factory = os.environ.get("HEADCOUNT_CUPTI_FACTORY")  # the GPU-boundary seam the tests use
            if factory:
                module, _, name = factory.partition(":")
                import importlib

                kwargs.update(zip(("cupti", "pm_module", "cuda_ready"), getattr(importlib.import_module(module), name)()))
            self.recorder = cupti_source.CuptiRecorder(
                pm_sampling=_env("PM", "1") == "1", pm_interval_ns=int(_env("PM_INTERVAL_NS", str(pm_sampler.DEFAULT_PM_INTERVAL_NS))),
                record_dir=os.path.join(self.raw, f"cupti-{self.pid}"), **kwargs)
            self.recorder.start()
        except HeadcountError as err:
            self.recorder = None
            self.notices.append(f"cupti source did not start: {err.one_line()}")
            notice(f"cupti source did not start in process {self.pid}, the program runs unprofiled: {err.one_line()}")
            return None
        for line in self.recorder.notices:
            notice(line)
        return self.recorder.range_log

    def _start_torch(self) -> None:
        """The torch backend's recorder, started as the first tagged step begins (a program's untagged warm-up
        is not recorded); once refused, the program runs unprofiled."""
        if self.backend != "torch" or self.recorder is not None or self.torch_refused or self.torch_trace is not None:
            return
        from headcount.collector import torch_source

        try:
            recorder = torch_source.TorchRecorder(
                os.path.join(self.raw, f"torch-{self.pid}"), pm_sampling=_env("PM", "1") == "1",
                pm_interval_ns=int(_env("PM_INTERVAL_NS", "0")))
            recorder.start()
        except HeadcountError as err:
            self.torch_refused = True
            self.notices.append(f"torch.profiler did not start: {err.one_line()}")
            notice(f"torch.profiler did not start in process {self.pid}, the program runs unprofiled: {err.one_line()}")
            return
        self.recorder = recorder
        for line in recorder.notices:
            self.notices.append(line)
            notice(line)

    def _stop_torch(self) -> None:
        """Stop the torch backend's recorder and write its trace (``torch-<pid>/trace.json``)."""
        if self.backend != "torch" or self.recorder is None:
            return
        recorder, self.recorder = self.recorder, None
        self.torch_trace = str(recorder.stop())

    # ------------------------------------------------------------ steps
    def _is_model(self, module) -> bool:
        cls = type(module)
        hit = self._types.get(cls)
        if hit is None:
            hit = self._types[cls] = isinstance(module, self._pretrained)
        return hit

    def _pre_forward(self, module, args):
        if not self._is_model(module):
            return None
        depth = getattr(self._local, "depth", 0)
        self._local.depth = depth + 1
        if depth == 0:
            self._next_step(module)
        return None

    def _post_forward(self, module, args, output):
        if self._is_model(module):
            self._local.depth = max(getattr(self._local, "depth", 1) - 1, 0)
        return None

    def _selected(self, step: int) -> bool:
        return self.steps is None or self.steps[0] <= step <= self.steps[1]

    def _next_step(self, model) -> None:
        self._close_step()
        self.step += 1
        self._sdpa_calls = 0
        selected = self._selected(self.step)
        if selected and not self.tagging:
            self._start_torch()  # before the step's range: a record_function range needs the profiler running
            self.tagger.activate()
            self.tagger.add_model(model)  # its own forward started before the tagger's hook existed
            self.tagging = True
            self._capture(True)
        elif not selected and self.tagging:
            self.tagger.deactivate()
            self.tagging = False
            self._capture(False)
            self._stop_torch()
        if selected:
            self.step_token = self.step_emitter.push(f"step.{self.step}")
            self.step_thread = threading.get_ident()

    def _close_step(self) -> None:
        # the open step is known by its thread: its token is None where no torch.profiler records (nsys, ncu), and
        # testing the token left every step open, nested in the one before (step.0/step.1/… in the H100's ncu report)
        if self.step_thread is not None and self.step_thread == threading.get_ident():
            self.step_emitter.pop(self.step_token)
        self.step_token = self.step_thread = None

    def _capture(self, on: bool) -> None:
        if not self.capture:
            return
        try:
            import torch

            from headcount.common.env import cuda_usable

            if cuda_usable():
                (torch.cuda.profiler.start if on else torch.cuda.profiler.stop)()
        except Exception as exc:  # noqa: BLE001 - capture ranges are an optimization, never a failure
            self.notices.append(f"capture range not set: {exc}")

    # ------------------------------------------------------------ sdpa outside transformers
    def _wrap_sdpa(self, torch) -> None:
        from headcount.tagging.tagger import tag_attention

        original = torch.nn.functional.scaled_dot_product_attention
        tagged: dict[int, object] = {}
        session = self

        def scaled_dot_product_attention(query, key, value, *args, **kwargs):
            caller = sys._getframe(1).f_globals.get("__name__", "")
            if not session.tagging or caller.startswith("transformers") or caller.startswith("headcount"):
                return original(query, key, value, *args, **kwargs)  # transformers' calls are tagged by the interface hook
            k = session._sdpa_calls
            session._sdpa_calls += 1
            fn = tagged.get(k)
            if fn is None:
                fn = tagged[k] = tag_attention(original, layer=f"sdpa.{k}")
            return fn(query, key, value, *args, **kwargs)

        torch.nn.functional.scaled_dot_product_attention = scaled_dot_product_attention

    # ------------------------------------------------------------ exit
    def finish(self, reason: str | None = None) -> None:
        """Close, flush and write this process's files (once)."""
        if self.finished:
            return
        self.finished = True
        reason = reason or self.signalled
        complete = reason is None and self.crashed is None
        try:
            self._close_step()
            if self.tagging:
                self.tagger.deactivate()
                self.tagging = False
            records = None
            if self.backend == "torch":
                self._stop_torch()
                records = self.torch_trace
            elif self.recorder is not None:
                if not complete:
                    self.recorder.stats["complete"] = False
                records = str(self.recorder.stop())
        except Exception as exc:  # noqa: BLE001 - write what we have, whatever failed
            self.notices.append(f"closing the session failed: {type(exc).__name__}: {exc}")
            records = None
        doc = asdict(ChildReport(
            pid=self.pid, rank=self.rank, local_rank=self.local_rank, world_size=self.world_size, backend=self.backend,
            mode=self.mode, steps_seen=self.step + 1, steps_selected=self.steps,
            calls=calls_to_rows(self.tagger.calls if self.tagger is not None else []), records=records, complete=complete,
            ended_by=reason or self.crashed or "exit", notices=list(self.notices), started=self.started, argv=list(sys.argv),
            device=_device(), program=_program(), nvtx_tagged=bool(self.tagger is not None and self.tagger.emitter.use_nvtx)))
        path = os.path.join(self.raw, CHILD_FILE.format(pid=self.pid))
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, default=str)
        os.replace(tmp, path)
        if self.resignal is not None:  # end as the signal's default action would have: status and all
            signal.signal(self.resignal, signal.SIG_DFL)
            os.kill(os.getpid(), self.resignal)


def _device() -> dict | None:
    """Where this process's work ran: the GPU it used if it initialized CUDA, else the CPU."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    from headcount.common.device import Device

    try:
        return Device.from_torch(torch.cuda.current_device() if torch.cuda.is_initialized() else "cpu").as_dict()
    except Exception:  # noqa: BLE001 - metadata only
        return None


def _program() -> dict:
    """torch and transformers versions of this (the recorded) program."""
    from headcount.common.env import program_versions

    return program_versions()


def _int(value):
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


_session: ChildSession | None = None


def install() -> None:
    """Set up the session when transformers' modeling code loads (see the module docstring)."""
    global _session
    if _session is not None or not _env("DIR"):
        return
    _session = ChildSession()
    session = _session

    def started(_module):
        try:
            session.start()
        except Exception as exc:  # noqa: BLE001 - never break the user's program
            notice(f"tagging could not start in process {os.getpid()}: {type(exc).__name__}: {exc}")
            session.notices.append(f"tagging could not start: {exc}")
            return
        atexit.register(session.finish)
        hook = sys.excepthook

        def excepthook(kind, value, tb):
            session.crashed = f"exception {kind.__name__}"
            hook(kind, value, tb)

        sys.excepthook = excepthook
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                previous = signal.getsignal(sig)
                signal.signal(sig, _on_signal(session, sig, previous))
            except ValueError:  # not the main thread
                pass

    _after_import("transformers.modeling_utils", started)


def _on_signal(session: ChildSession, sig, previous):
    """The handler of SIGINT/SIGTERM: it only notes the signal and lets the program unwind (KeyboardInterrupt, or
    SystemExit where the default action would end it); the files are written at exit (atexit), once no lock the
    interrupted code held is held any more. Flushing CUPTI inside the handler could wait for a lock the
    interrupted frame holds: a program stopped there never ended."""
    def handler(signum, frame):
        if previous is signal.SIG_IGN:
            return
        session.signalled = f"signal {signal.Signals(signum).name}"
        if callable(previous):
            return previous(signum, frame)  # SIGINT: Python's own handler raises KeyboardInterrupt
        session.resignal = signum
        raise SystemExit(128 + signum)
    return handler


def _after_import(name: str, callback) -> None:
    """Run ``callback(module)`` right after module ``name`` is first imported
    (at once if it already is)."""
    if name in sys.modules:
        callback(sys.modules[name])
        return
    import importlib.abc
    import importlib.util

    class Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname, path, target=None):
            if fullname != name:
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(fullname)
            if spec is None or spec.loader is None:
                return spec
            loader = spec.loader
            exec_module = loader.exec_module

            def run_then_callback(module):
                exec_module(module)
                callback(module)

            loader.exec_module = run_then_callback
            return spec

    sys.meta_path.insert(0, Finder())
