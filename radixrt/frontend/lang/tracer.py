"""Tracing: run a program on placeholder arguments to find the text every run of it starts with.

`run_batch` computes that constant prefix once (and keeps it cached) before the batch starts,
so the batch's programs all find it in the radix cache instead of racing to compute it.
Tracing stops at the first thing that depends on an argument or on the model.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from radixrt.frontend.lang.backend import ChatFormat
from radixrt.frontend.lang.ir import Concat, Expr, RoleBegin, RoleEnd, Text, as_expr, flatten
from radixrt.frontend.lang.transcript import Transcript


class _TraceStop(Exception):
    """The program reached something that is not constant."""


def _stop(*_args: Any, **_kwargs: Any) -> Any:
    raise _TraceStop


class _End(Expr):
    """Where an argument's text would start: the trace ends here, after what came before."""


class TraceArg:
    """Stands for a program argument: any use of it ends the trace. `"text " + arg` keeps the
    constant text before the argument."""

    def __radixrt_expr__(self) -> Expr:
        return _End()

    def __radd__(self, other: Any) -> Expr:
        return Concat((as_expr(other), _End()))

    def __add__(self, other: Any) -> Expr:
        return _End()

    __str__ = __format__ = __repr__ = __mul__ = _stop
    __getattr__ = __getitem__ = __iter__ = __len__ = __bool__ = __eq__ = __hash__ = _stop
    __lt__ = __le__ = __gt__ = __ge__ = __contains__ = __call__ = __int__ = __float__ = _stop


class TracingState:
    """The subset of ProgramState a program's constant prefix can use."""

    def __init__(self, chat: Callable[[], ChatFormat]) -> None:
        self.transcript = Transcript(chat)

    def __iadd__(self, expr: Any) -> TracingState:
        for leaf in flatten(as_expr(expr)):
            if isinstance(leaf, Text):
                self.transcript.text += leaf.text
            elif isinstance(leaf, RoleBegin):
                self.transcript.begin_role(leaf.role)
            elif isinstance(leaf, RoleEnd):
                self.transcript.end_role(leaf.role)
            else:  # gen, select, or an argument's text: not constant
                raise _TraceStop
        return self

    @contextlib.contextmanager
    def _role(self, role: str) -> Iterator[TracingState]:
        self.transcript.begin_role(role)
        yield self
        self.transcript.end_role(role)

    def _role_or_message(self, role: str, content: Any) -> Any:
        if content is None:
            return self._role(role)
        self += Concat((RoleBegin(role), as_expr(content), RoleEnd(role)))
        return None

    def system(self, content: Any = None) -> Any:
        return self._role_or_message("system", content)

    def user(self, content: Any = None) -> Any:
        return self._role_or_message("user", content)

    def assistant(self, content: Any = None) -> Any:
        return self._role_or_message("assistant", content)

    __getitem__ = fork = text = messages = get_var = get_meta_info = text_iter = _stop
    __setitem__ = __contains__ = set_var = copy = text_async_iter = atext_iter = _stop


def constant_prefix(func: Callable[..., Any], arg_names: list[str],
                    chat: Callable[[], ChatFormat]) -> str:
    """The text `func(s, **args)` appends before anything depends on its arguments or the model.

    Best effort: whatever the program does with a placeholder (or any error) ends the trace."""
    state = TracingState(chat)
    with contextlib.suppress(Exception):
        func(state, **{name: TraceArg() for name in arg_names})
    return state.transcript.text
