"""How a program's states run their expressions: on threads (`run`), or all on one asyncio event
loop (`arun`), with the same executor code either way.

A program is ordinary blocking code: `s["x"]` waits for a gen, `forks.join()` waits for the
children. `ThreadRunner` gives every state a thread that runs its expressions, and a wait blocks
the waiting thread. `LoopRunner` runs the program function, and every state's expression loop, as
greenlets on the event loop's thread: a wait (a condition, a queue, a backend call) switches back
to the event loop with the awaitable to wait for (`await_`), and the loop switches back in once
it is done (`spawn`). So thousands of programs, forks and selects included, run on one loop
without a thread each: the greenlets are the only stacks, and only the backend's I/O is async.
This is the pattern of SQLAlchemy's asyncio layer; the `greenlet` package provides the switching,
and each greenlet sees the context variables of the code that started the program.

The executor asks its runner for a condition (`with cond:`, `wait_for`, `notify_all`), a queue
(`put`, `get`), a way to start its expression loop (returning a join function) and a way to call
the backend (`call(backend, "generate", ...)`: the backend's async twin `agenerate` when it has
one, else the blocking method on a worker thread).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import queue
import threading
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import greenlet

from radixrt.frontend.lang.backend import BackendError

T = TypeVar("T")


@functools.lru_cache(maxsize=256)
def _parameters(fn: Any) -> frozenset[str]:
    params = inspect.signature(fn).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return frozenset({"**"})
    return frozenset(p.name for p in params)


def invoke(fn: Callable[..., T], args: tuple[Any, ...], priority: int | None,
           images: Sequence[bytes] = ()) -> T:
    """fn(*args, priority=priority), or fn(*args) for a backend method written before
    priorities existed (one that takes no `priority`); with images (the text's, rx.image),
    also images=..., which a method without that keyword cannot take (BackendError)."""
    names = _parameters(getattr(fn, "__func__", fn))
    keywords: dict[str, Any] = {}
    if priority is not None and ("priority" in names or "**" in names):
        keywords["priority"] = priority
    if images:
        if not ("images" in names or "**" in names):
            raise BackendError(f"this backend's {getattr(fn, '__name__', 'method')} takes no "
                               "images (no images= keyword): run programs with rx.image on "
                               "rx.Runtime or rx.RuntimeEndpoint")
        keywords["images"] = tuple(images)
    return fn(*args, **keywords)


class ThreadRunner:
    """A thread per state; waits block (the DSL's `run`)."""

    def condition(self) -> threading.Condition:
        return threading.Condition()

    def queue(self) -> queue.SimpleQueue:
        return queue.SimpleQueue()

    def start(self, target: Callable[[], None], name: str) -> Callable[[], None]:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        return thread.join

    def call(self, backend: Any, method: str, *args: Any, priority: int | None = None,
             images: Sequence[bytes] = ()) -> Any:
        return invoke(getattr(backend, method), args, priority, images)

    def cancel(self) -> None:
        """Threads cannot be cancelled: a run ends when its calls return."""


# --- greenlets on the event loop -----------------------------------------------------------------
class Bridged(greenlet.greenlet):
    """A greenlet started by `spawn`: inside it, `await_` may switch to the loop."""


def in_loop_program() -> bool:
    """Whether the caller runs under `spawn` (an arun program or state), where `await_` works."""
    return isinstance(greenlet.getcurrent(), Bridged)


def await_(awaitable: Awaitable[T]) -> T:
    """Wait for `awaitable` from blocking code running under `spawn`: switch to the event loop,
    which awaits it and switches back with its result (or raises its exception here)."""
    current = greenlet.getcurrent()
    if not isinstance(current, Bridged):
        raise RuntimeError("a program state of arun was used outside its event loop's "
                           "program: read it after `await prog.arun(...)` returns, or in the "
                           "program itself")
    return current.parent.switch(awaitable)  # type: ignore[union-attr]


async def spawn(fn: Callable[..., T], *args: Any,
                on_cancel: Callable[[], None] | None = None) -> T:
    """Run blocking `fn(*args)` as a greenlet on this event loop, awaiting what it waits for;
    it sees the caller's context variables. Cancelling the task that awaits this calls
    on_cancel, then raises CancelledError inside `fn` where it waits."""
    child = Bridged(fn, greenlet.getcurrent())
    child.gr_context = contextvars.copy_context()
    pending = child.switch(*args)
    while not child.dead:
        try:
            value = await pending
        except BaseException as exc:  # noqa: BLE001 - raised inside fn, where it waited
            if isinstance(exc, asyncio.CancelledError) and on_cancel is not None:
                on_cancel()
            pending = child.throw(exc)
        else:
            pending = child.switch(value)
    return pending  # fn's return value


def _on_loop(loop: asyncio.AbstractEventLoop, fn: Callable[..., Any]) -> Callable[..., None]:
    def call_on_loop(*args: Any) -> None:
        loop.call_soon_threadsafe(fn, *args)
    return call_on_loop


class LoopCondition:
    """A condition variable for greenlets on one loop: no lock is needed (they switch only where
    they wait), `wait_for` waits on an event that `notify_all` sets."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def __enter__(self) -> LoopCondition:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def notify_all(self) -> None:
        self._event.set()
        self._event = asyncio.Event()

    def wait_for(self, predicate: Callable[[], T]) -> T:
        while not (result := predicate()):
            await_(self._event.wait())
        return result

    async def wait_async(self) -> None:
        """For async code on the loop itself (state.atext_iter): until the next notify."""
        await self._event.wait()


class LoopQueue:
    def __init__(self) -> None:
        self._queue: asyncio.Queue = asyncio.Queue()

    def put(self, item: Any) -> None:
        self._queue.put_nowait(item)

    def get(self) -> Any:
        return await_(self._queue.get())


class LoopRunner:
    """Every state on the running event loop (the DSL's `arun`)."""

    def __init__(self) -> None:
        self.tasks: list[asyncio.Task] = []  # every state's expression loop, for cancel()

    def condition(self) -> LoopCondition:
        return LoopCondition()

    def queue(self) -> LoopQueue:
        return LoopQueue()

    def start(self, target: Callable[[], None], name: str) -> Callable[[], None]:
        task = asyncio.get_running_loop().create_task(spawn(target), name=name)
        self.tasks.append(task)

        def join() -> None:  # as Thread.join: the loop's own failure is the state's error
            if not task.done():
                await_(asyncio.wait({task}))
        return join

    def call(self, backend: Any, method: str, *args: Any, priority: int | None = None,
             images: Sequence[bytes] = ()) -> Any:
        twin = getattr(backend, f"a{method}", None)
        if twin is not None:
            return await_(invoke(twin, args, priority, images))
        # a blocking backend, on the loop's default executor (as many calls at once as it has
        # threads; cancelling stops the wait, not the call): its callbacks (streamed pieces)
        # are handed back to the loop, in order, ahead of the call's own result
        loop = asyncio.get_running_loop()
        args = tuple(_on_loop(loop, a) if callable(a) else a for a in args)
        return await_(asyncio.to_thread(invoke, getattr(backend, method), args, priority,
                                        images))

    def cancel(self) -> None:
        """Cancel every state's expression loop (their calls in flight abort their requests)."""
        for task in self.tasks:
            task.cancel()
