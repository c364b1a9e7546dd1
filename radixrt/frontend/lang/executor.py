"""StreamExecutor: runs what a program appends to one state, in order, apart from the program
(on a thread of its own with `run`, as a greenlet on the event loop with `arun`: runners.py).

`s += expr` only queues the expression, so a program's forks run at the same time; reading a
variable (`s["x"]`) or the text waits for the work it depends on. A failure stops the state: the
rest of its queue is dropped and every reader gets the exception.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Iterator
from typing import Any

from radixrt.frontend.lang.backend import SEPARATE_REASONING, Backend, BackendError
from radixrt.frontend.lang.ir import (
    Gen,
    RoleBegin,
    RoleEnd,
    Select,
    SetVar,
    Text,
    ToolPrompt,
    VarScopeBegin,
    VarScopeEnd,
    as_expr,
    flatten,
)
from radixrt.frontend.lang.runners import LoopCondition, LoopRunner, ThreadRunner
from radixrt.frontend.lang.select_methods import pick
from radixrt.frontend.lang.tools import parse_calls
from radixrt.frontend.lang.transcript import Transcript

_END = object()


class StreamExecutor:
    def __init__(
        self,
        backend: Backend,
        transcript: Transcript,
        variables: dict[str, Any] | None = None,
        stream: bool = False,
        priority: int = 0,
        defaults: dict[str, Any] | None = None,
        runner: ThreadRunner | LoopRunner | None = None,
    ) -> None:
        self.backend = backend
        self.runner = runner or ThreadRunner()
        self.priority = priority  # of every gen / select that does not name its own
        self.defaults: dict[str, Any] = dict(defaults or {})  # the run's sampling options
        self._scopes: dict[str, list[int]] = {}  # var_scope name -> text positions it began at
        self.transcript = transcript
        self.variables: dict[str, Any] = dict(variables or {})
        self.meta: dict[str, dict[str, Any]] = {}
        self.set_here: list[str] = []  # variables this state set itself (not inherited), in order
        self.stream = stream
        self.error: BaseException | None = None
        self._cond = self.runner.condition()
        self._pending = 0  # leaves queued and not yet run
        self._done = False
        self._log: list[tuple[str | None, str]] = []  # (variable or None, text) as appended
        self._queue = self.runner.queue()
        self._join = self.runner.start(self._loop, "radixrt-state")

    def child(self) -> StreamExecutor:
        """A fork's executor: a copy of this state's text and variables, the same backend,
        priority, sampling defaults and runner."""
        return StreamExecutor(self.backend, self.transcript.copy(), self.variables, self.stream,
                              self.priority, self.defaults, self.runner)

    def pin(self, text: str) -> Any:
        return self.runner.call(self.backend, "pin", text, priority=self.priority)

    def unpin(self, handle: Any) -> None:
        self.runner.call(self.backend, "unpin", handle)

    # --- called by the program's thread -----------------------------------------------------
    def submit(self, expr: Any) -> None:
        leaves = flatten(as_expr(expr))
        with self._cond:
            self._raise_if_failed()
            if self._done:
                raise RuntimeError("this program state has ended: nothing more can be appended")
            self._pending += len(leaves)
        for leaf in leaves:
            self._queue.put(leaf)

    def sync(self) -> None:
        """Wait until everything queued so far has run; raise the state's failure if any."""
        with self._cond:
            self._cond.wait_for(lambda: self._pending == 0 or self.error is not None)
            self._raise_if_failed()

    def get(self, name: str) -> Any:
        """The variable's value, once the gen/select that sets it has run."""
        with self._cond:
            self._cond.wait_for(
                lambda: name in self.variables or self.error is not None or self._pending == 0
            )
            self._raise_if_failed()
            if name not in self.variables:
                known = sorted(self.variables)
                raise KeyError(f"variable {name!r} is not set; set so far: {known}")
            return self.variables[name]

    def end(self) -> None:
        """Finish the queue and stop the thread (raises the state's failure, if any)."""
        with self._cond:
            if self._done:
                self._raise_if_failed()
                return
        self._queue.put(_END)
        self._join()
        with self._cond:
            self._raise_if_failed()

    def merge(self, values: dict[str, Any], meta: dict[str, Any]) -> None:
        """Join: take the children's variables (each a list, one value per child)."""
        with self._cond:
            self.variables.update(values)
            self.meta.update(meta)
            self.set_here += [n for n in values if n not in self.set_here]  # nested joins
            self._cond.notify_all()

    def pieces(self, name: str | None) -> Iterator[str]:
        """Text as it is appended: of one variable, or (name None) everything."""
        index = 0
        while True:
            with self._cond:
                self._cond.wait_for(functools.partial(self._has_news, index, name))
                batch = self._log[index:]
                index = len(self._log)
                finished = self._finished_for(name)
            for var, text in batch:
                if name is None or var == name:
                    yield text
            if finished:
                with self._cond:
                    self._raise_if_failed()
                return

    async def apieces(self, name: str | None) -> AsyncIterator[str]:
        """`pieces` for async code on the event loop of an arun (a state of `run`: its
        blocking iterator, one step at a time on a worker thread)."""
        if not isinstance(self._cond, LoopCondition):
            pieces, done = self.pieces(name), object()
            while (piece := await asyncio.to_thread(next, pieces, done)) is not done:
                yield piece  # type: ignore[misc]
            return
        index = 0
        while True:
            while not self._has_news(index, name):
                await self._cond.wait_async()
            batch, index = self._log[index:], len(self._log)
            for var, text in batch:
                if name is None or var == name:
                    yield text
            if self._finished_for(name):
                self._raise_if_failed()
                return

    # --- the executor thread -----------------------------------------------------------------
    def _loop(self) -> None:
        try:
            while True:
                leaf = self._queue.get()  # arun: a cancel while idle ends the loop here
                if leaf is _END:
                    break
                try:
                    if self.error is None:
                        self._run(leaf)
                except BaseException as exc:  # noqa: BLE001 - any failure ends the state
                    with self._cond:
                        self.error = exc
                finally:
                    with self._cond:
                        self._pending -= 1
                        self._cond.notify_all()
        finally:  # however the loop ends, every reader wakes up and sees it
            with self._cond:
                self._done = True
                self._cond.notify_all()

    def fail(self, exc: BaseException) -> None:
        """The program failed (outside any expression): readers of this state see it."""
        with self._cond:
            self.error = self.error or exc
            self._cond.notify_all()

    def _run(self, leaf: Any) -> None:
        if isinstance(leaf, Text):
            self._append(None, leaf.text)
        elif isinstance(leaf, RoleBegin):
            self._append(None, self.transcript.begin_role(leaf.role), add=False)
        elif isinstance(leaf, RoleEnd):
            self._append(None, self.transcript.end_role(leaf.role), add=False)
        elif isinstance(leaf, VarScopeBegin):
            self._scopes.setdefault(leaf.name, []).append(len(self.transcript.text))
        elif isinstance(leaf, VarScopeEnd):
            start = self._scopes[leaf.name].pop()
            self._set(leaf.name, self.transcript.text[start:], {})
        elif isinstance(leaf, SetVar):
            self._set(leaf.name, leaf.value, {})
        elif isinstance(leaf, ToolPrompt):
            prompt = self.transcript.chat().tool_prompt
            if not prompt:
                raise BackendError("this backend has no tool prompt: rx.tool_prompt needs "
                                   "rx.RuntimeEndpoint or rx.Runtime")
            self._append(None, prompt.replace("{tools}", leaf.listing))
        elif isinstance(leaf, Gen):
            self._gen(leaf)
        elif isinstance(leaf, Select):
            self._select(leaf)
        else:
            raise TypeError(f"cannot run {leaf!r}")

    def _gen(self, leaf: Gen) -> None:
        streamed: list[str] = []

        def on_piece(piece: str) -> None:
            streamed.append(piece)
            self._log_piece(leaf.name, piece)

        params = {**self.defaults, **leaf.params}  # the gen's own options (its constraint) win
        if leaf.separate_reasoning:  # not a sampling field: the runtime's endpoint takes it
            params[SEPARATE_REASONING] = True
        result = self.runner.call(self.backend, "generate", self.transcript.text, params,
                                  on_piece if self.stream else None,
                                  priority=self._priority(leaf.priority))
        reason = result.finish_reason or ""
        what = f"gen {leaf.name!r}" if leaf.name else "gen"
        if reason.startswith("error"):  # the runtime ended it: never a silent empty answer
            raise BackendError(f"{what} failed in the runtime: {reason.removeprefix('error: ')}")
        value: Any = result.text
        extra: dict[str, Any] = {}
        if leaf.separate_reasoning:
            value = result.content if result.content is not None else result.text
            extra["reasoning"] = result.reasoning
        if leaf.constraint_kind == "tool_calls":
            try:
                value = parse_calls(result.tool_calls)
            except ValueError as exc:
                raise BackendError(f"{what}: {exc}") from None
        self.transcript.text += result.text
        already = "".join(streamed)
        if result.text.startswith(already) and len(result.text) > len(already):
            self._log_piece(leaf.name, result.text[len(already):])
        self._set(leaf.name, value, {
            **extra,
            "finish_reason": result.finish_reason,
            "prompt_tokens": result.prompt_tokens,
            "cached_tokens": result.cached_tokens,
            "completion_tokens": result.completion_tokens,
            **result.logprobs,
        })

    def _select(self, leaf: Select) -> None:
        unconditional = leaf.method == "unconditional_likelihood_normalized"
        scored = self.runner.call(self.backend, "score", self.transcript.text,
                                  list(leaf.choices), unconditional,
                                  priority=self._priority(leaf.priority))
        best, scores = pick(leaf.method, scored)
        choice = leaf.choices[best]
        self._append(leaf.name, choice)
        self._set(leaf.name, choice, {
            "method": leaf.method,
            "scores": scores,
            "token_logprobs": [c.logprobs for c in scored],
            "unconditional_token_logprobs": [c.unconditional for c in scored],
        })

    def _priority(self, own: int | None) -> int:
        return self.priority if own is None else own

    def _append(self, name: str | None, text: str, add: bool = True) -> None:
        if add:
            self.transcript.text += text
        self._log_piece(name, text)

    def _log_piece(self, name: str | None, text: str) -> None:
        if text:
            with self._cond:
                self._log.append((name, text))
                self._cond.notify_all()

    def _set(self, name: str | None, value: Any, meta: dict[str, Any]) -> None:
        if name is None:
            return
        with self._cond:
            self.variables[name] = value
            self.meta[name] = meta
            if name not in self.set_here:
                self.set_here.append(name)
            self._cond.notify_all()

    # --- helpers (hold self._cond) ----------------------------------------------------------
    def _has_news(self, index: int, name: str | None) -> bool:
        return index < len(self._log) or self._finished_for(name)

    def _finished_for(self, name: str | None) -> bool:
        if self.error is not None or self._done:
            return True
        return name is not None and name in self.variables

    def _raise_if_failed(self) -> None:
        if self.error is not None:
            raise self.error
