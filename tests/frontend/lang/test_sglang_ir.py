"""`radixrt.lang.ir`: what SGLang programs import from `sglang.lang.ir`, importable under both
names (`sglang.lang.ir` resolves to it when `sglang` is radixrt), with SGLang's values."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys

import pytest

import radixrt as rx
from radixrt.lang.ir import (
    REGEX_BOOL,
    REGEX_FLOAT,
    REGEX_INT,
    REGEX_STR,
    REGEX_STRING,
    SglConstantText,
    SglExpr,
    SglFunction,
    SglGen,
    SglSelect,
)

# sglang 0.5.23's sglang/lang/ir.py, character for character
SGLANGS = {
    "REGEX_INT": r"[-+]?[0-9]+[ \n]*",
    "REGEX_FLOAT": r"[-+]?[0-9]*\.?[0-9]+[ \n]*",
    "REGEX_BOOL": r"(True|False)",
    "REGEX_STR": r"\"[\w\d\s]*\"",
}


def test_the_regex_building_blocks_are_sglangs():
    assert {"REGEX_INT": REGEX_INT, "REGEX_FLOAT": REGEX_FLOAT, "REGEX_BOOL": REGEX_BOOL,
            "REGEX_STR": REGEX_STR} == SGLANGS
    assert REGEX_STRING == REGEX_STR
    assert re.fullmatch(REGEX_INT, "365\n") and re.fullmatch(REGEX_FLOAT, "-3.14 ")
    assert re.fullmatch(REGEX_STR, '"Paris 1"') and not re.fullmatch(REGEX_STR, '"a"b"')
    pattern = r"\[" + REGEX_INT + "(, " + REGEX_INT + r")*\]"  # pasted into a user's own
    assert rx.gen("xs", regex=pattern).params["regex"] == pattern


def test_sglang_class_names_are_radixrts_classes():
    prog = SglFunction(lambda s: None, num_api_spec_tokens=8)
    assert isinstance(prog, rx.Program) and prog.num_api_spec_tokens == 8
    assert isinstance(rx.gen("x"), SglGen) and isinstance(rx.select("y", ["a", "b"]), SglSelect)
    assert isinstance(SglConstantText("hi"), SglExpr)


def test_names_radixrt_lacks_are_refused_by_name():
    with pytest.raises(ImportError, match="SglSamplingParams is not part of radixrt"):
        from radixrt.lang.ir import SglSamplingParams  # noqa: F401
    with pytest.raises(ImportError, match=r"sgl\.image\(path_or_bytes\)"):
        importlib.import_module("radixrt.lang.ir").SglImage  # noqa: B018
    assert not hasattr(importlib.import_module("radixrt.lang.ir"), "nonsense")


def test_sglang_lang_ir_resolves_when_sglang_is_radixrt():
    code = ("import sys, radixrt; sys.modules['sglang'] = radixrt\n"
            "from sglang.lang.ir import REGEX_INT, REGEX_FLOAT, REGEX_STR\n"
            "import sglang as sgl\n"
            "assert sgl.gen is radixrt.gen and REGEX_INT == radixrt.lang.ir.REGEX_INT\n"
            "assert 'torch' not in sys.modules\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
