"""ProgramState: the `s` a program appends to; ForkGroup: the states `s.fork(n)` returns."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any

from radixrt.frontend.lang.ir import (
    Concat,
    Expr,
    RoleBegin,
    RoleEnd,
    SetVar,
    TextWithImages,
    VarScopeBegin,
    VarScopeEnd,
    as_expr,
)

if TYPE_CHECKING:
    from radixrt.frontend.lang.executor import StreamExecutor


class ProgramState:
    """`s += text | gen(...) | select(...) | user(...)`; `s["name"]` waits for a variable."""

    def __init__(self, executor: StreamExecutor) -> None:
        self._executor = executor
        self.forks: list[ProgramState] = []  # every child of every fork, in creation order
        self.return_value: Any = None  # what the program function returned
        self._groups: list[ForkGroup] = []
        self._finished = threading.Event()  # the program function has returned (or failed)
        self._task: Any = None  # arun(stream=True): the asyncio task running the program

    # --- appending ---------------------------------------------------------------------------
    def __iadd__(self, expr: Any) -> ProgramState:
        self._executor.submit(expr)
        return self

    @contextlib.contextmanager
    def _role_scope(self, role: str) -> Iterator[ProgramState]:
        self._executor.submit(RoleBegin(role))
        yield self
        self._executor.submit(RoleEnd(role))

    def _role(self, role: str, content: Any) -> Any:
        if content is None:
            return self._role_scope(role)
        self._executor.submit(Concat((RoleBegin(role), as_expr(content), RoleEnd(role))))
        return None

    def system(self, content: Any = None) -> Any:
        """`with s.system(): s += "..."`: the same as `s += system("...")`, which SGLang's
        `s.system("...")` also is."""
        return self._role("system", content)

    def user(self, content: Any = None) -> Any:
        return self._role("user", content)

    def assistant(self, content: Any = None) -> Any:
        return self._role("assistant", content)

    # SGLang's spellings of the same: s.user_begin(); s += ...; s.user_end()
    def system_begin(self) -> None:
        self._executor.submit(RoleBegin("system"))

    def system_end(self) -> None:
        self._executor.submit(RoleEnd("system"))

    def user_begin(self) -> None:
        self._executor.submit(RoleBegin("user"))

    def user_end(self) -> None:
        self._executor.submit(RoleEnd("user"))

    def assistant_begin(self) -> None:
        self._executor.submit(RoleBegin("assistant"))

    def assistant_end(self) -> None:
        self._executor.submit(RoleEnd("assistant"))

    @contextlib.contextmanager
    def var_scope(self, name: str) -> Iterator[ProgramState]:
        """`with s.var_scope("x"): s += ...`: variable x is all the text appended inside."""
        self._executor.submit(VarScopeBegin(name))
        yield self
        self._executor.submit(VarScopeEnd(name))

    def set_var(self, name: str, value: Any) -> ProgramState:
        """Set a variable, in order with what was appended before (as a gen would)."""
        self._executor.submit(SetVar(name, value))
        return self

    def fork(self, n: int = 1, position_ids_offset: Any = None) -> ForkGroup:
        """n states that continue from the text so far. That text is computed once and kept in
        the runtime's cache until the group is joined (or the program ends); the children run
        concurrently. (SGLang's position_ids_offset is not supported.)"""
        if position_ids_offset is not None:
            raise TypeError("fork(position_ids_offset=...) is not supported: radixrt's forks "
                            "continue at the parent's positions")
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"fork(n) needs an int n >= 1, got {n!r}")
        ex = self._executor
        ex.sync()
        handle = ex.pin(ex.transcript.text) if ex.transcript.text else None
        children = [ProgramState(ex.child()) for _ in range(n)]
        group = ForkGroup(self, children, handle)
        self.forks.extend(children)
        self._groups.append(group)
        return group

    @contextlib.contextmanager
    def copy(self, position_ids_offset: Any = None) -> Iterator[ProgramState]:
        """SGLang's `with s.copy() as c:` a fork of one, joined at the end of the block."""
        group = self.fork(1, position_ids_offset)
        try:
            yield group[0]
        finally:
            group.join()

    def __setitem__(self, name: str, value: Any) -> None:
        """`s["x"] = value`: set_var (also on a finished state, as SGLang's)."""
        self._executor.assign(name, value)

    # --- reading -----------------------------------------------------------------------------
    def __getitem__(self, name: str) -> Any:
        return self._executor.get(name)

    def __contains__(self, name: str) -> bool:
        """`"x" in s`: whether variable x is set, once what was appended so far has run."""
        self._executor.sync()
        return name in self._executor.variables

    def error(self) -> BaseException | None:
        """The state's failure once what was appended so far has run (None: none); SGLang's
        state.error(). Reading the state raises it too."""
        with contextlib.suppress(Exception):
            self._executor.sync()
        return self._executor.error

    def get_var(self, name: str) -> Any:
        return self._executor.get(name)

    def get_meta_info(self, name: str) -> dict[str, Any]:
        """How a variable came about: finish_reason and token counts for gen; the method, the
        scores and the token log-probabilities of every choice for select."""
        self._executor.get(name)
        return self._executor.meta[name]

    @property
    def variables(self) -> dict[str, Any]:
        self._executor.sync()
        return dict(self._executor.variables)

    def text(self) -> str:
        self._executor.sync()
        return self._executor.transcript.text

    def messages(self) -> list[dict[str, str]]:
        self._executor.sync()
        return [dict(m) for m in self._executor.transcript.messages]

    def text_iter(self, name: str | None = None, *, var_name: str | None = None
                  ) -> Iterator[str]:
        """Stream text as it arrives: of the variable `name` (SGLang's var_name), or all of it
        (None). Pieces come as the model makes them when the program runs with
        run(stream=True)."""
        return self._executor.pieces(_one_name(name, var_name))

    def atext_iter(self, name: str | None = None, *, var_name: str | None = None
                   ) -> AsyncIterator[str]:
        """`text_iter` for asyncio: `async for piece in state.atext_iter("x")`, on a state of
        `arun(stream=True)` (or of `run`, read from a worker thread)."""
        return self._executor.apieces(_one_name(name, var_name))

    def text_async_iter(self, var_name: str | None = None,
                        return_meta_data: bool = False) -> AsyncIterator[Any]:
        """SGLang's name of `atext_iter`; with return_meta_data, (piece, meta info) pairs: for a
        gen's pieces completion_tokens (so far) and, with logprobs, output_token_logprobs (only
        those new since the previous piece) and output_token_logprobs_length (so far):
        stream_meta.py. Text no gen made comes with {} (a select's choice: its meta info)."""
        return self._executor.apieces(var_name, with_meta=return_meta_data)

    async def await_done(self) -> ProgramState:
        """An `arun(stream=True)` program's end: wait for it; raises its failure."""
        if self._task is not None:
            await self._task
        return self

    def sync(self) -> ProgramState:
        """Wait for what has been appended so far."""
        self._executor.sync()
        return self

    def wait(self, timeout: float | None = None) -> ProgramState:
        """Wait for the whole program (a run(stream=True) runs in the background); raises its
        failure."""
        if self._task is not None:
            raise RuntimeError("an arun(stream=True) state is waited for with "
                               "`await state.await_done()`, not wait()")
        if not self._finished.wait(timeout):
            raise TimeoutError(f"the program did not finish within {timeout} s")
        self._executor.sync()
        return self

    # --- ending ------------------------------------------------------------------------------
    def _end(self) -> None:
        """Finish this state and its forks (joining any group not joined); raise the first
        failure."""
        first: BaseException | None = None
        for group in self._groups:
            try:
                group.join()
            except BaseException as exc:  # noqa: BLE001 - keep ending the rest
                first = first or exc
            for child in group.states:
                try:
                    child._end()
                except BaseException as exc:  # noqa: BLE001
                    first = first or exc
        try:
            self._executor.end()
        except BaseException as exc:  # noqa: BLE001
            first = first or exc
        if first is not None:
            raise first

    def __repr__(self) -> str:
        with contextlib.suppress(Exception):
            return f"ProgramState(text={self.text()!r})"
        return "ProgramState(<failed>)"


def _one_name(name: str | None, var_name: str | None) -> str | None:
    if name is not None and var_name is not None:
        raise TypeError("give the variable as name or as SGLang's var_name, not both")
    return name if var_name is None else var_name


JOIN_MODES = ("gather_variable", "concate_and_append")


class ForkGroup:
    """The children of one fork. `forks += expr` appends to each (`forks += lambda i: ...`: the
    expression for child i); `forks[i] += expr` to one. `join()` waits for all and releases the
    shared prefix; mode "gather_variable" (the default) gives the parent every variable the
    children set as a list (one value per child; its get_meta_info is the list of the
    children's); mode "concate_and_append" (SGLang's spelling) appends each child's new text to
    the parent's, in order."""

    def __init__(self, parent: ProgramState, states: list[ProgramState], handle: Any) -> None:
        self.parent = parent
        self.states = states
        self._handle = handle
        self._joined = False
        self._start = len(parent._executor.transcript.text)  # where the children's text starts
        self._images = len(parent._executor.transcript.images)  # ... and their images

    def __len__(self) -> int:
        return len(self.states)

    def __iter__(self) -> Iterator[ProgramState]:
        return iter(self.states)

    def __getitem__(self, i: int) -> ProgramState:
        return self.states[i]

    def __setitem__(self, i: int, state: ProgramState) -> None:
        """`forks[i] += expr` (Python appends to forks[i], then stores it back here)."""
        if state is not self.states[i]:
            raise TypeError("a fork's children cannot be replaced: append to them with "
                            "forks[i] += ...")

    def __iadd__(self, expr: Any) -> ForkGroup:
        """An expression for every child; a function of the child's index; or (SGLang's) a
        list or tuple of one expression per child."""
        if isinstance(expr, (list, tuple)):
            if len(expr) != len(self.states):
                raise ValueError(f"forks += a list of {len(expr)} expressions for "
                                 f"{len(self.states)} forks: give one per fork")
            for state, one in zip(self.states, expr):
                state += one
            return self
        for i, state in enumerate(self.states):
            state += expr(i) if callable(expr) and not isinstance(expr, Expr) else expr
        return self

    def join(self, mode: str = "gather_variable") -> ForkGroup:
        if mode not in JOIN_MODES:
            raise ValueError(f"join(mode={mode!r}) is unknown: use one of {JOIN_MODES}")
        if self._joined:
            return self
        self._joined = True
        try:
            for state in self.states:
                state.sync()
            if mode == "concate_and_append":  # the children's text, with the images in it
                self.parent += TextWithImages(
                    "".join(s._executor.transcript.text[self._start:] for s in self.states),
                    tuple(image for s in self.states
                          for image in s._executor.transcript.images[self._images:]))
                self.parent._executor.sync()
                return self
            names: list[str] = []  # every variable a child set after the fork, in order
            for state in self.states:
                names += [n for n in state._executor.set_here if n not in names]
            values = {n: [s._executor.variables.get(n) for s in self.states] for n in names}
            meta = {n: [s._executor.meta.get(n) for s in self.states] for n in names}
            self.parent._executor.merge(values, meta)
        finally:
            if self._handle is not None:
                self.parent._executor.unpin(self._handle)
        return self
