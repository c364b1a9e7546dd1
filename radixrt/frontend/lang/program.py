"""`@radixrt.function`: a Python function over a program state, run on a backend."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from radixrt.frontend.lang.api import DEFAULT_BACKEND, check_priority
from radixrt.frontend.lang.backend import PREFILL_ONLY, Backend, program_backend
from radixrt.frontend.lang.executor import StreamExecutor
from radixrt.frontend.lang.global_config import PRINTS_TEXT_FROM, global_config
from radixrt.frontend.lang.runners import LoopRunner, spawn
from radixrt.frontend.lang.sglang_names import (
    is_sampling_option,
    sampling_fields,
    sampling_params_of,
)
from radixrt.frontend.lang.speculation import Speculation
from radixrt.frontend.lang.state import ProgramState
from radixrt.frontend.lang.tracer import constant_prefix
from radixrt.frontend.lang.transcript import Transcript

MAX_BATCH_THREADS = 64  # run_batch: programs in flight at once by default


class Program:
    def __init__(self, func: Callable[..., Any], num_api_spec_tokens: int | None = None,
                 bind_arguments: Mapping[str, Any] | None = None) -> None:
        """num_api_spec_tokens: API speculative execution (speculation.py): a gen's call writes
        up to this many tokens past it, and later gens and literal text take their values from
        that text. bind_arguments: arguments every run passes (SGLang's `bind`)."""
        self.func = func
        params = list(inspect.signature(func).parameters.values())
        if not params:
            raise TypeError(f"@function {func.__name__} must take the state as its first argument")
        self.arg_names = [p.name for p in params[1:]]
        if num_api_spec_tokens is not None:
            Speculation(num_api_spec_tokens)  # a bad value raises here, naming it
        self.num_api_spec_tokens = num_api_spec_tokens
        self.bind_arguments = dict(bind_arguments or {})
        unknown = sorted(set(self.bind_arguments) - set(self.arg_names))
        if unknown:
            raise TypeError(f"{func.__name__} takes no argument(s) {unknown} to bind")
        functools.update_wrapper(self, func)

    def bind(self, **kwargs: Any) -> Program:
        """A program that runs with these arguments given (SGLang's `bind`)."""
        return Program(self.func, self.num_api_spec_tokens, {**self.bind_arguments, **kwargs})

    def cache(self, backend: Backend | None = None) -> str:
        """Compute the program's constant prefix (found by tracing) in the runtime now, so that
        the runs that follow find it cached (SGLang's `cache`); the prefix is returned. Unlike
        run_batch's, it is not pinned: it stays in the cache as long as the cache keeps it."""
        backend = backend or DEFAULT_BACKEND.get()
        prefix = constant_prefix(self.func, self.arg_names, backend.chat_format)
        if prefix:
            backend.generate(prefix, dict(PREFILL_ONLY), None)
        return prefix

    def trace(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            "SGLang's Program.trace() (its IR graph of a program) is not supported: radixrt "
            "traces a program only for its constant prefix, which run_batch computes and caches "
            "by itself (and prog.cache() on demand)")

    def run(self, *args: Any, backend: Backend | None = None, stream: bool = False,
            priority: int = 0, **kwargs: Any) -> ProgramState:
        """Run once; returns the finished state. With stream=True it returns at once while the
        program runs in the background: iterate `state.text_iter(name)` to follow it.
        priority: of every gen / select of the run that does not name its own (lower is more
        urgent in the runtime's queue). Keyword arguments that are not the program's own and
        are sampling options (temperature=0, max_tokens / SGLang's max_new_tokens, ...) are
        defaults for every gen of the run; a gen's own options win."""
        backend = backend or DEFAULT_BACKEND.get()
        check_priority(priority)
        kwargs, defaults = self._split_defaults(kwargs)
        bound = self._bind(args, kwargs)
        backend = program_backend(backend)  # over several replicas: this program's one
        state = ProgramState(StreamExecutor(backend, Transcript(backend.chat_format), None, stream,
                                            priority, defaults,
                                            spec_tokens=self.num_api_spec_tokens))
        if stream:
            threading.Thread(target=self._run_quietly, args=(state, bound), daemon=True,
                             name=f"radixrt-{self.func.__name__}").start()
            return state
        self._run_state(state, bound)
        return state

    __call__ = run

    async def arun(self, *args: Any, backend: Backend | None = None, stream: bool = False,
                   priority: int = 0, **kwargs: Any) -> ProgramState:
        """`run` on asyncio: `await prog.arun(...)` runs the program, its forks and selects as
        greenlets on this event loop (no thread each: runners.py), so thousands run at once.
        With stream=True it returns at once while the program runs as a task: follow it with
        `async for piece in state.atext_iter(name)`, end with `await state.await_done()`.
        Cancelling the task that awaits it aborts the program's requests in the runtime."""
        backend = backend or DEFAULT_BACKEND.get()
        check_priority(priority)
        kwargs, defaults = self._split_defaults(kwargs)
        return await self._arun_bound(backend, self._bind(args, kwargs), defaults, priority,
                                      stream)

    async def _arun_bound(self, backend: Backend, bound: dict[str, Any],
                          defaults: dict[str, Any], priority: int,
                          stream: bool = False) -> ProgramState:
        runner = LoopRunner()
        backend = program_backend(backend)
        state = ProgramState(StreamExecutor(backend, Transcript(backend.chat_format), None, stream,
                                            priority, defaults, runner,
                                            self.num_api_spec_tokens))
        if stream:
            state._task = asyncio.ensure_future(self._arun_state(state, bound, runner))
            return state
        await self._arun_state(state, bound, runner)
        return state

    async def arun_batch(
        self,
        batch: Sequence[Mapping[str, Any] | Sequence[Any]],
        *,
        backend: Backend | None = None,
        max_concurrency: int | None = None,
        prefix_cache: bool | None = None,
        priority: int = 0,
        **sampling: Any,
    ) -> list[ProgramState]:
        """`run_batch` on asyncio: every program at once on this event loop (at most
        max_concurrency at a time, if given). Raises the first failure after the batch."""
        backend = backend or DEFAULT_BACKEND.get()
        check_priority(priority)
        defaults = run_defaults(sampling, f"{self.func.__name__}.arun_batch()")
        if max_concurrency is not None and max_concurrency < 1:
            raise ValueError(f"max_concurrency={max_concurrency}: give an int >= 1 (or leave "
                             "it out: all at once)")
        if not batch:
            return []
        bounds = [self._bind(tuple(a), {}) if _is_positional(a) else self._bind((), dict(a))
                  for a in batch]
        limit = asyncio.Semaphore(max_concurrency or len(batch))
        handle = None
        if _precache(prefix_cache):
            prefix = constant_prefix(self.func, self.arg_names, backend.chat_format)
            if prefix:
                pin = functools.partial(LoopRunner().call, backend, "pin", priority=priority)
                handle = await spawn(pin, prefix)

        async def one(bound: dict[str, Any]) -> ProgramState:
            async with limit:
                return await self._arun_bound(backend, bound, defaults, priority)

        try:
            outcomes = await asyncio.gather(*(one(b) for b in bounds), return_exceptions=True)
        finally:
            if handle is not None:
                await spawn(LoopRunner().call, backend, "unpin", handle)
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
        return list(outcomes)  # type: ignore[arg-type]

    async def _arun_state(self, state: ProgramState, bound: dict[str, Any],
                          runner: LoopRunner) -> None:
        # cancelled: first the states' expression loops (their calls in flight abort their
        # requests), then the program where it waits
        await spawn(self._run_state, state, bound, on_cancel=runner.cancel)

    def run_batch(
        self,
        batch: Sequence[Mapping[str, Any] | Sequence[Any]],
        *,
        backend: Backend | None = None,
        num_threads: int | str | None = None,
        progress_bar: bool = False,
        prefix_cache: bool | None = None,
        priority: int = 0,
        **sampling: Any,
    ) -> list[ProgramState]:
        """Run once per kwargs dict (or per list of positional arguments), concurrently
        (num_threads programs at a time, default or "auto": all, up to 64). The program's
        constant prefix (found by tracing) is computed once first and kept cached for the batch
        (prefix_cache; None: global_config.enable_precache_with_tracing, True by default).
        `sampling`: defaults for every gen, as run's. Raises the first program failure after
        the batch has finished."""
        backend = backend or DEFAULT_BACKEND.get()
        check_priority(priority)
        defaults = run_defaults(sampling, f"{self.func.__name__}.run_batch()")
        if not batch:
            return []
        bounds = [self._bind(tuple(kw), {}) if _is_positional(kw) else self._bind((), dict(kw))
                  for kw in batch]
        if num_threads == "auto":
            num_threads = None
        if num_threads is not None and (not isinstance(num_threads, int) or num_threads < 1):
            raise ValueError(f"num_threads={num_threads!r}: give an int >= 1 or 'auto'")
        threads = num_threads or min(len(bounds), MAX_BATCH_THREADS)
        handle = None
        if _precache(prefix_cache):
            prefix = constant_prefix(self.func, self.arg_names, backend.chat_format)
            handle = backend.pin(prefix, priority) if prefix else None
        progress = _Progress(len(bounds), progress_bar, self.func.__name__)
        try:
            with ThreadPoolExecutor(max_workers=threads) as pool:
                futures = [pool.submit(self._run_one, backend, b, progress, priority, defaults)
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
    def _split_defaults(self, kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """(the program's keyword arguments, the run's sampling defaults): a keyword the
        program takes is its own; a sampling option it does not take is a default."""
        own = set(self.arg_names)
        mine = {k: v for k, v in kwargs.items() if k in own or not is_sampling_option(k)}
        options = {k: v for k, v in kwargs.items() if k not in mine}
        return mine, run_defaults(options, f"{self.func.__name__}.run()")

    def _bind(self, args: tuple, kwargs: dict[str, Any]) -> dict[str, Any]:
        kwargs = {**self.bind_arguments, **kwargs}
        try:
            bound = inspect.signature(self.func).bind(None, *args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"{self.func.__name__}: {exc}") from None
        bound.apply_defaults()
        return dict(list(bound.arguments.items())[1:])

    def _run_state(self, state: ProgramState, bound: dict[str, Any]) -> None:
        try:
            state.return_value = self.func(state, **bound)
        except BaseException as exc:
            state._executor.fail(exc)  # streamed readers see the program's own failure
            with contextlib.suppress(BaseException):  # the program's own error is the one to see
                state._end()
            state._finished.set()
            raise
        try:
            state._end()
        finally:
            state._finished.set()
        if global_config.verbosity >= PRINTS_TEXT_FROM:
            print(state.text())

    def _run_quietly(self, state: ProgramState, bound: dict[str, Any]) -> None:
        """Streaming runs: a failure is recorded on the state, where its readers see it."""
        try:
            self._run_state(state, bound)
        except BaseException as exc:  # noqa: BLE001
            state._executor.fail(exc)

    def _run_one(self, backend: Backend, bound: dict[str, Any], progress: _Progress,
                 priority: int, defaults: dict[str, Any]
                 ) -> tuple[ProgramState, BaseException | None]:
        backend = program_backend(backend)
        state = ProgramState(StreamExecutor(backend, Transcript(backend.chat_format),
                                            priority=priority, defaults=defaults,
                                            spec_tokens=self.num_api_spec_tokens))
        try:
            self._run_state(state, bound)
            return state, None
        except Exception as exc:  # noqa: BLE001 - reported after the batch
            return state, exc
        finally:
            progress.tick()


def run_defaults(options: dict[str, Any], where: str) -> dict[str, Any]:
    """A run's sampling defaults (radixrt's or SGLang's names), checked here: n and the
    constraints are a gen's own (gen(regex=...), fork for samples), never a run's."""
    defaults = sampling_fields(options, where)
    refused = sorted({"n", "regex", "json_schema", "choices", "tools"} & set(defaults))
    if refused:
        raise TypeError(f"{where}: {refused} cannot be a run's default for every gen: give "
                        "them to a gen (fork the state for several samples)")
    sampling_params_of(defaults)  # a bad default raises here, naming the field
    return defaults


def _is_positional(args: Any) -> bool:
    """run_batch: a list or tuple of positional arguments (SGLang's form), not a kwargs dict."""
    return isinstance(args, (list, tuple))


def function(func: Callable[..., Any] | None = None, *,
             num_api_spec_tokens: int | None = None) -> Any:
    """Decorate `def prog(s, ...)` to make a runnable program: prog.run(...), prog.run_batch.
    `@function(num_api_spec_tokens=N)`: API speculative execution (speculation.py)."""
    if func is not None:
        return Program(func, num_api_spec_tokens)
    return functools.partial(Program, num_api_spec_tokens=num_api_spec_tokens)


def _precache(prefix_cache: bool | None) -> bool:
    return global_config.enable_precache_with_tracing if prefix_cache is None else prefix_cache


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
