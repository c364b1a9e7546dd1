"""Runs SGLang's own frontend test programs (sglang/test/test_programs.py from the PyPI package)
through SGLang's own frontend against a running server: `python sglang_frontend_driver.py URL
NAME[:SECONDS]...` prints one JSON object, test name -> {"ok": true} | {"error", "where"}.

Run with the sglang package (installed with --no-deps) on PYTHONPATH, in its own process. The
runtime handle is what sgl.Runtime is to SGLang's frontend, minus launching SGLang's server: an
object whose `.endpoint` is sgl.RuntimeEndpoint(url) (SGLang's interpreter takes any backend with
an `endpoint`). One substitution, for a server-side helper a test imports, not for the frontend:
sglang.srt.utils.hf_transformers_utils (its get_tokenizer needs torchvision, which SGLang's server
installs and its frontend does not) is replaced by transformers' AutoTokenizer, which is what
get_tokenizer loads for a local tokenizer folder.
"""

from __future__ import annotations

import inspect
import json
import sys
import threading
import traceback
import types
from typing import Any

PER_TEST_S = 90.0


def substitute_tokenizer_helper() -> None:
    from transformers import AutoTokenizer

    module = types.ModuleType("sglang.srt.utils.hf_transformers_utils")

    def get_tokenizer(path: str, *args: Any, **kwargs: Any) -> Any:
        return AutoTokenizer.from_pretrained(path)

    module.get_tokenizer = get_tokenizer  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module


class ServedRuntime:
    """sgl.Runtime's frontend face for a server started elsewhere."""

    def __init__(self, url: str) -> None:
        import sglang as sgl

        self.endpoint = sgl.RuntimeEndpoint(url)


def run_one(fn: Any, timeout_s: float) -> dict[str, Any]:
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            kwargs = {"check_answer": True} if "check_answer" in inspect.signature(fn).parameters \
                else {}
            fn(**kwargs)
            box["ok"] = True
        except BaseException as exc:  # reported, the next test runs
            box["error"] = f"{type(exc).__name__}: {exc}"[:1500]
            box["where"] = traceback.format_exc()[-2500:]

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout_s)
    return box or {"error": f"Timeout: no result after {timeout_s:.0f} s"}


def main(url: str, names: list[str]) -> None:
    substitute_tokenizer_helper()
    import sglang as sgl
    from sglang.test import test_programs

    sgl.set_default_backend(ServedRuntime(url))
    results = {}
    for spec in names:
        name, _, seconds = spec.partition(":")
        results[name] = run_one(getattr(test_programs, name),
                                float(seconds) if seconds else PER_TEST_S)
    print(json.dumps(results), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
