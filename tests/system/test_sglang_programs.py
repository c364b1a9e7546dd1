"""SGLang's own frontend test programs run unchanged on radixrt's DSL.

The test takes sglang/test/test_programs.py from SGLang's PyPI package (sglang==0.5.23, installed
with `pip install --no-deps --target` into a temporary folder: only that file is read, nothing of
SGLang is imported) and runs every test function in it that needs no image against a radixrt
Runtime on the default model, with the module `sglang` resolved to radixrt (`sglang.lang.ir` to
radixrt.lang.ir); test_image_qa (`sgl.image`) runs apart, against a Runtime on the tiny random
LLaVA-1.5 of tests/tiny_vlms.py. It runs them in a child process (this file, run as a script),
so that the `sglang` alias and the runtime never touch the pytest process, and writes each
test's outcome to a JSON file as it finishes.

Every test must run through the API. A failure is allowed only where SGLang's test checks the
answer of a much larger model, and then only as the AssertionError of an `assert` line of
test_programs.py itself: a TypeError, an AttributeError, a backend error, a timeout or an
assertion raised anywhere else fails this test. MODEL_ANSWERS lists those tests and why the
135M model may miss (IMAGE_MODEL_ANSWERS: why the random LLaVA does).
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import json
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
import types
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow  # installs a package, starts a runtime

SGLANG = "sglang==0.5.23"
PROGRAMS = Path("sglang") / "test" / "test_programs.py"
NEEDS_IMAGE = {"test_image_qa": "sgl.image needs a vision-language model: "
                                "test_image_qa_runs_on_a_tiny_llava runs it"}
# the picture test_image_qa opens, from its working directory: the wheel ships no such file, so
# the test writes one (any picture: the model is random, and CLIP's processor takes any size)
EXAMPLE_IMAGE = "example_image.png"
IMAGE_MODEL_ANSWERS = {
    "test_image_qa": "expects the answer to name a taxi or a car: a random tiny LLaVA writes "
                     "random tokens about a random picture",
}
# how SGLang's own suite for its runtime backend calls these (test_srt_backend.py)
CALL_KWARGS: dict[str, dict[str, Any]] = {"test_select": {"check_answer": False}}
# tests whose `assert` checks an answer a 135M model may get wrong, and why. On the default
# model, few_shot_qa answers "New York", decode_int writes 24 and then zeros up to max_tokens,
# react and expert_answer name neither answer, parallel_encoding ends its turn at once, and
# tool_use and completion_speculative pass (the latter by its sample, at temperature 1).
MODEL_ANSWERS = {
    "test_few_shot_qa": "expects the capitals of the US, Japan, the UK and China word for word",
    "test_decode_int": "expects 24 hours in a day and 365 days in a year",
    "test_expert_answer": "expects the expert's answer to name Paris",
    "test_tool_use": "expects the model to write the expression 257*983 for the calculator",
    "test_react": "expects the ReAct loop to finish on Finland or the United States",
    "test_parallel_encoding": "expects Noah as Julian's father, read from three statements",
    "test_completion_speculative": "samples at temperature 1 and expects the model to write the "
                                   "Birthday and Job lines in the example's format (then one "
                                   "call, fewer prompt tokens); a sample that does not makes "
                                   "as many calls as without speculation",
}
# generous: on an idle 2-core machine the longest test (decode_json_regex, 768 constrained
# tokens) takes ~1 min and all of them ~5 min, on a loaded one many times that
PER_TEST_S = 1800.0
CHILD_TIMEOUT_S = 7200.0


# --- the child process ----------------------------------------------------------------------------
def alias_sglang_to_radixrt() -> None:
    """`import sglang` is radixrt from here on. test_programs.py also imports two helpers of
    SGLang's server package; this harness provides them as small real functions (they are not
    part of the frontend under test): sglang.srt.utils.is_hip (False: no ROCm here) and
    sglang.srt.utils.hf_transformers_utils.get_tokenizer (transformers' AutoTokenizer on the
    local folder the runtime's endpoint names)."""
    import radixrt
    import radixrt.lang
    import radixrt.lang.ir

    sys.modules["sglang"] = radixrt
    sys.modules["sglang.lang"] = radixrt.lang
    sys.modules["sglang.lang.ir"] = radixrt.lang.ir
    srt = types.ModuleType("sglang.srt")
    utils = types.ModuleType("sglang.srt.utils")
    hf_utils = types.ModuleType("sglang.srt.utils.hf_transformers_utils")

    def is_hip() -> bool:
        return False

    def get_tokenizer(path: str, *args: Any, **kwargs: Any) -> Any:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(path)

    utils.is_hip = is_hip  # type: ignore[attr-defined]
    hf_utils.get_tokenizer = get_tokenizer  # type: ignore[attr-defined]
    srt.utils = utils  # type: ignore[attr-defined]
    utils.hf_transformers_utils = hf_utils  # type: ignore[attr-defined]
    for module in (srt, utils, hf_utils):
        sys.modules[module.__name__] = module


def outcome(exc: BaseException | None, seconds: float) -> dict[str, Any]:
    if exc is None:
        return {"passed": True, "seconds": round(seconds, 1)}
    frames = traceback.extract_tb(exc.__traceback__)
    return {"passed": False, "seconds": round(seconds, 1), "type": type(exc).__name__,
            "message": str(exc)[:2000],
            "raised_at": [frames[-1].filename, frames[-1].lineno, frames[-1].line]
            if frames else None,
            "traceback": "".join(traceback.format_exception(exc))[-6000:]}


def run_programs(programs: str, report: str, model: str = "default",
                 only: str | None = None) -> None:
    """Run test_programs.py's tests (only: that one) on a Runtime of `model`."""
    alias_sglang_to_radixrt()
    import radixrt as rx

    spec = importlib.util.spec_from_file_location("sglang_test_programs", programs)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    tests = [(name, fn) for name, fn in vars(module).items()
             if name.startswith("test_") and inspect.isfunction(fn) and only in (None, name)]
    results: dict[str, Any] = {}
    runtime = rx.Runtime(model_path=model, max_total_tokens=16384 if model == "default" else 2048,
                         log_level="warning")
    rx.set_default_backend(runtime)
    try:
        for name, fn in tests:
            if name in NEEDS_IMAGE and only is None:
                results[name] = {"skipped": NEEDS_IMAGE[name]}
                continue
            box: dict[str, Any] = {}

            def call(fn: Any = fn, name: str = name, box: dict[str, Any] = box) -> None:
                try:
                    fn(**CALL_KWARGS.get(name, {}))
                except BaseException as exc:  # noqa: BLE001 - recorded for the parent
                    box["error"] = exc

            start = time.monotonic()
            thread = threading.Thread(target=call, daemon=True, name=name)
            thread.start()
            thread.join(PER_TEST_S)
            if thread.is_alive():  # the rest is not run: the parent reports what did not
                results[name] = {"passed": False, "type": "Timeout",
                                 "message": f"still running after {PER_TEST_S:.0f} s"}
            else:
                results[name] = outcome(box.get("error"), time.monotonic() - start)
            Path(report).write_text(json.dumps(results, indent=1))
            print(f"{name}: {json.dumps(results[name])[:300]}", flush=True)
            if thread.is_alive():
                break
    finally:
        runtime.shutdown()  # a test still running (a daemon thread) ends with the process


# --- the test -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def programs_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("sglang")
    try:
        done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q",
                               "--disable-pip-version-check", "--target", str(target), SGLANG],
                              capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        pytest.skip(f"pip could not install {SGLANG} within 600 s (no package index here?)")
    path = target / PROGRAMS
    if done.returncode != 0 or not path.is_file():
        pytest.skip(f"pip could not install {SGLANG} (no package index here?): "
                    f"{(done.stderr or done.stdout).strip()[-500:]}")
    return path


def run_child(programs_file: Path, folder: Path, *args: str,
              cwd: Path | None = None) -> tuple[dict[str, Any], str]:
    """This file as a script (args: run_programs' model and only), its report in `folder`: its
    results and stderr."""
    report = folder / "results.json"
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    # its own process group: the child and the runtime it starts end together if it hangs
    child = subprocess.Popen([sys.executable, __file__, str(programs_file), str(report), *args],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                             start_new_session=True, cwd=cwd)
    try:
        _, stderr = child.communicate(timeout=CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        _, stderr = child.communicate()
        stderr += f"\n(killed after {CHILD_TIMEOUT_S:.0f} s)"
    stderr = f"(exit code {child.returncode})\n{stderr[-4000:]}"
    return (json.loads(report.read_text()) if report.is_file() else {}), stderr


def test_sglang_test_programs_run_unchanged(programs_file: Path, tmp_path: Path) -> None:
    results, stderr = run_child(programs_file, tmp_path)
    source = programs_file.read_text()
    expected = [name for name in _test_names(source) if name not in NEEDS_IMAGE]
    assert [n for n in results if n not in NEEDS_IMAGE] == expected, (
        f"not every test ran {stderr}")
    assert_only_model_answers_fail(results, expected, MODEL_ANSWERS, programs_file)


def test_image_qa_runs_on_a_tiny_llava(programs_file: Path, tmp_path: Path) -> None:
    """SGLang's test_image_qa (`sgl.image("example_image.png")` in a user turn, then a gen) on a
    Runtime of the tiny LLaVA; its answer check may fail only as IMAGE_MODEL_ANSWERS says."""
    from tiny_vlms import build_llava, images

    from radixrt.runtime.models.loader import load_tokenizer

    folder = tmp_path / "llava"
    folder.mkdir()
    build_llava(folder, load_tokenizer("default"))
    images([(64, 48)], seed=5)[0].save(tmp_path / EXAMPLE_IMAGE)  # where the child runs
    results, stderr = run_child(programs_file, tmp_path, str(folder), "test_image_qa",
                                cwd=tmp_path)
    assert list(results) == ["test_image_qa"], f"it did not run {stderr}"
    assert_only_model_answers_fail(results, ["test_image_qa"], IMAGE_MODEL_ANSWERS,
                                   programs_file)


def assert_only_model_answers_fail(results: dict[str, Any], expected: list[str],
                                   allowed: dict[str, str], programs_file: Path) -> None:
    """Each expected test passed, or (one of `allowed`) failed at an assert of its own (a line
    of an `assert` statement of test_programs.py: Python names the line of the failing part of
    one written over several lines, as test_image_qa's is)."""
    assert_lines = {line for node in ast.walk(ast.parse(programs_file.read_text()))
                    if isinstance(node, ast.Assert)
                    for line in range(node.lineno, (node.end_lineno or node.lineno) + 1)}
    problems = []
    for name, result in results.items():  # shown with `pytest -s`
        if result.get("passed") or "skipped" in result:
            print(f"{name}: {'passed' if result.get('passed') else 'skipped: '}"
                  f"{result.get('skipped', '')}")
        else:
            print(f"{name}: {result['type']} {(result.get('message') or '')[:120]!r}")
    for name in expected:
        result = results[name]
        if result["passed"]:
            continue
        where = result.get("raised_at")
        own_assert = (result["type"] == "AssertionError" and where is not None
                      and Path(where[0]) == programs_file
                      and where[1] in assert_lines)
        if not (name in allowed and own_assert):
            problems.append(f"{name}: {result['type']}: {result['message']}\n"
                            f"{result.get('traceback', '')}")
    assert not problems, "\n\n".join(problems)


def _test_names(source: str) -> list[str]:
    return [line.split("(")[0].removeprefix("def ") for line in source.splitlines()
            if line.startswith("def test_")]


if __name__ == "__main__":
    run_programs(*sys.argv[1:])
