"""`@radixrt.function`: a Python function over a program state, run on a backend."""

from __future__ import annotations

import contextlib
import functools
import inspect
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from radixrt.frontend.api import DEFAULT_BACKEND, check_priority
from radixrt.frontend.backend import Backend
from radixrt.frontend.executor import StreamExecutor
from radixrt.frontend.state import ProgramState
from radixrt.frontend.tracer import constant_prefix
from radixrt.frontend.transcript import Transcript
from radixrt.runtime.config import MAX_BATCH_THREADS


class Program:
    def __init__(self, func: Callable[..., Any]) -> None:
        self.func = func
        params = list(inspect.signature(func).parameters.values())
        if not params:
            raise TypeError(f"@function {func.__name__} must take the state as its first argument")
        self.arg_names = [p.name for p in params[1:]]
        functools.update_wrapper(self, func)

    def run(self, *args: Any, backend: Backend | None = None, stream: bool = False,
            priority: int = 0, **kwargs: Any) -> ProgramState:
        """Run once; returns the finished state. With stream=True it returns at once while the
        program runs in the background: iterate `state.text_iter(name)` to follow it.
        priority: of every gen / select of the run that does not name its own (lower is more
        urgent in the runtime's queue)."""
        backend = backend or DEFAULT_BACKEND.get()
        check_priority(priority)
        bound = self._bind(args, kwargs)
        state = ProgramState(StreamExecutor(backend, Transcript(backend.chat_format), None, stream,
                                            priority))
        if stream:
            threading.Thread(target=self._run_quietly, args=(state, bound), daemon=True,
                             name=f"radixrt-{self.func.__name__}").start()
            return state
        self._run_state(state, bound)
        return state

    __call__ = run

    def run_batch(
        self,
        batch: Sequence[Mapping[str, Any]],
        *,
        backend: Backend | None = None,
        num_threads: int | None = None,
        progress_bar: bool = False,
        prefix_cache: bool = True,
        priority: int = 0,
    ) -> list[ProgramState]:
        """Run once per kwargs dict, concurrently (num_threads programs at a time, default all up
        to 64). The program's constant prefix (found by tracing) is computed once first and kept
        cached for the batch. Raises the first program failure after the batch has finished."""
        backend = backend or DEFAULT_BACKEND.get()
        check_priority(priority)
        if not batch:
            return []
        bounds = [self._bind((), dict(kw)) for kw in batch]
        threads = num_threads or min(len(bounds), MAX_BATCH_THREADS)
        handle = None
        if prefix_cache:
            prefix = constant_prefix(self.func, self.arg_names, backend.chat_format)
            handle = backend.pin(prefix) if prefix else None
        progress = _Progress(len(bounds), progress_bar, self.func.__name__)
        try:
            with ThreadPoolExecutor(max_workers=threads) as pool:
                futures = [pool.submit(self._run_one, backend, b, progress, priority)
                           for b in bounds]
                outcomes = [f.result() for f in futures]
        finally:
            progress.close()
            if handle is not None:
                backend.unpin(handle)
        for _, error in outcomes:
            if error is not None:
                raise error
        return [state for state, _ in outcomes]

    # --- internals ---------------------------------------------------------------------------
    def _bind(self, args: tuple, kwargs: dict[str, Any]) -> dict[str, Any]:
        try:
            bound = inspect.signature(self.func).bind(None, *args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"{self.func.__name__}: {exc}") from None
        bound.apply_defaults()
        return dict(list(bound.arguments.items())[1:])

    def _run_state(self, state: ProgramState, bound: dict[str, Any]) -> None:
        try:
            state.return_value = self.func(state, **bound)
        except BaseException:
            with contextlib.suppress(BaseException):  # the program's own error is the one to see
                state._end()
            state._finished.set()
            raise
        try:
            state._end()
        finally:
            state._finished.set()

    def _run_quietly(self, state: ProgramState, bound: dict[str, Any]) -> None:
        """Streaming runs: a failure is recorded on the state, where its readers see it."""
        try:
            self._run_state(state, bound)
        except BaseException as exc:  # noqa: BLE001
            ex = state._executor
            with ex._cond:
                ex.error = ex.error or exc
                ex._cond.notify_all()

    def _run_one(self, backend: Backend, bound: dict[str, Any], progress: _Progress,
                 priority: int) -> tuple[ProgramState, BaseException | None]:
        state = ProgramState(StreamExecutor(backend, Transcript(backend.chat_format),
                                            priority=priority))
        try:
            self._run_state(state, bound)
            return state, None
        except Exception as exc:  # noqa: BLE001 - reported after the batch
            return state, exc
        finally:
            progress.tick()


def function(func: Callable[..., Any]) -> Program:
    """Decorate `def prog(s, ...)` to make a runnable program: prog.run(...), prog.run_batch."""
    return Program(func)


class _Progress:
    def __init__(self, total: int, enabled: bool, name: str) -> None:
        self.total, self.enabled, self.name = total, enabled, name
        self.done = 0
        self._lock = threading.Lock()

    def tick(self) -> None:
        with self._lock:
            self.done += 1
            if self.enabled:
                sys.stderr.write(f"\r{self.name}: {self.done}/{self.total} programs")
                sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")
