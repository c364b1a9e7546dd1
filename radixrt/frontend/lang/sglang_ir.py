"""What SGLang programs import from `sglang.lang.ir`, as `radixrt.lang.ir` gives it (the
`radixrt/lang/ir` package re-exports this module, so that `sglang.lang.ir` resolves when `sglang`
is radixrt).

- REGEX_INT, REGEX_FLOAT, REGEX_BOOL, REGEX_STR: SGLang's regex building blocks, its exact values
  (users paste them into patterns of their own: `gen(regex=r"\\[" + REGEX_INT + r"\\]")`), and
  REGEX_STRING, older SGLang's name of REGEX_STR.
- SGLang's IR class names, for isinstance checks and annotations, on radixrt's classes:
  SglFunction (a @function program; `SglFunction(func, num_api_spec_tokens=N)` builds one),
  SglExpr, SglConstantText (`SglConstantText("text")` works), SglGen, SglSelect, SglExprList
  (Concat), SglRoleBegin, SglRoleEnd, SglVarScopeBegin, SglVarScopeEnd. radixrt's Gen and
  Select take their own fields: build them with gen() / select().
- The other `sglang.lang.ir` names (SglSamplingParams, SglImage, SglVideo, SglFork, ...) raise
  an ImportError that names them and says what to use instead.
"""

from __future__ import annotations

from typing import Any

from radixrt.frontend.lang.ir import (
    Concat,
    Expr,
    Gen,
    RoleBegin,
    RoleEnd,
    Select,
    Text,
    VarScopeBegin,
    VarScopeEnd,
)
from radixrt.frontend.lang.program import Program
from radixrt.frontend.lang.sglang_names import REGEX_BOOL, REGEX_FLOAT, REGEX_INT, REGEX_STR

REGEX_STRING = REGEX_STR  # older SGLang's name

SglFunction = Program
SglExpr = Expr
SglConstantText = Text
SglGen = Gen
SglSelect = Select
SglExprList = Concat
SglRoleBegin = RoleBegin
SglRoleEnd = RoleEnd
SglVarScopeBegin = VarScopeBegin
SglVarScopeEnd = VarScopeEnd

# sglang.lang.ir names radixrt does not have, and what to use instead
NOT_HERE = {
    "SglSamplingParams": "a gen's options are SamplingParams fields (rx.SamplingParams), given "
                         "to gen() / run() as keywords",
    "SglImage": "build an image with sgl.image(path_or_bytes) (radixrt's Image holds the "
                "file's bytes, read on the client)",
    "SglVideo": "radixrt takes images (sgl.image), not video",
    "SglArgument": "program arguments are plain Python values",
    "SglFork": "forks are made by state.fork(n)",
    "SglGetForkItem": "forks are made by state.fork(n); index the group it returns",
    "SglVariable": "read a variable with state[name]",
    "SglConcateAndAppend": "forks.join(mode=\"concate_and_append\")",
    "SglCommitLazy": "radixrt runs each expression as it is appended; nothing is lazy",
    "SglSeparateReasoning": "gen(..., separate_reasoning=True) on a runtime with "
                            "--reasoning-parser",
}

__all__ = [
    "REGEX_BOOL", "REGEX_FLOAT", "REGEX_INT", "REGEX_STR", "REGEX_STRING", "SglConstantText",
    "SglExpr", "SglExprList", "SglFunction", "SglGen", "SglRoleBegin", "SglRoleEnd", "SglSelect",
    "SglVarScopeBegin", "SglVarScopeEnd",
]


def not_here(module: str, name: str) -> Exception:
    """The error for a name radixrt does not have: for SGLang's names, an ImportError that says
    what to use instead (an AttributeError would reach `from ... import` as a bare "cannot
    import name"); for any other name, the usual AttributeError."""
    if name in NOT_HERE:
        return ImportError(f"SGLang's {name} is not part of radixrt: {NOT_HERE[name]}",
                           name=module)
    return AttributeError(f"module {module!r} has no attribute {name!r}")


def __getattr__(name: str) -> Any:
    raise not_here(__name__, name)
