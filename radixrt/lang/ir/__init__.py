"""`sglang.lang.ir`'s names for SGLang programs (its regex building blocks REGEX_INT, REGEX_FLOAT,
REGEX_BOOL, REGEX_STR, and its IR class names): radixrt.frontend.lang.sglang_ir has them and
says what each is; a name radixrt lacks raises an error naming it."""

from typing import Any

from radixrt.frontend.lang.sglang_ir import *  # noqa: F403 - this package is that module's path
from radixrt.frontend.lang.sglang_ir import __all__ as __all__
from radixrt.frontend.lang.sglang_ir import not_here


def __getattr__(name: str) -> Any:
    raise not_here(__name__, name)
