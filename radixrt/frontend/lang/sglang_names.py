"""SGLang's spellings, accepted beside radixrt's own, so that a program written for SGLang's
frontend runs with only its import changed (`import radixrt as sgl`). radixrt's names stay the
primary ones; the "Coming from SGLang" table of docs/dsl.md lists every alias here.

Sampling options (of `gen` and of `run` / `run_batch` / a direct call) are translated to
SamplingParams fields by `sampling_fields`; `dtype=` becomes a regex constraint (`DTYPE_REGEX`,
the patterns SGLang uses, without their trailing whitespace); SGLang options radixrt does not have
are refused with a message that names them and says what to use instead.
"""

from __future__ import annotations

from typing import Any

from radixrt.runtime.sampling_params import SamplingParams

# SGLang name -> SamplingParams field
SAMPLING_ALIASES = {
    "max_new_tokens": "max_tokens",
    "return_logprob": "logprobs",
    "top_logprobs_num": "top_logprobs",
    "logprob_start_len": "prompt_logprobs_start",
}
# gen(dtype=...): the output matches this pattern in full (and parses as the type)
DTYPE_REGEX: dict[Any, str] = {
    int: r"[-+]?[0-9]+",
    float: r"[-+]?[0-9]*\.?[0-9]+",
    bool: r"(True|False)",
    str: r"\"[\w\d\s]*\"",
}
DTYPE_NAMES = {"int": int, "float": float, "bool": bool, "str": str}
# SGLang options radixrt does not take, and what to do instead
UNSUPPORTED = {
    "return_text_in_logprobs": "token logprobs carry token ids (meta info "
                               "output_token_logprobs); decode them with the model's tokenizer",
    "image": "radixrt runs text-only models",
    "video": "radixrt runs text-only models",
    "spaces_between_special_tokens": "radixrt has no such option",
}
SAMPLING_FIELDS = frozenset(SamplingParams.__struct_fields__)


def sampling_fields(options: dict[str, Any], where: str) -> dict[str, Any]:
    """SamplingParams fields from options spelled radixrt's way or SGLang's. Raises TypeError
    for an option neither knows, or one SGLang has and radixrt does not (naming it)."""
    out: dict[str, Any] = {}
    for name, value in options.items():
        if name in UNSUPPORTED:
            raise TypeError(f"{where}: SGLang's {name}= is not supported here: "
                            f"{UNSUPPORTED[name]}")
        field = SAMPLING_ALIASES.get(name, name)
        if field not in SAMPLING_FIELDS:
            raise TypeError(f"{where} got unknown option(s) [{name!r}]; options: "
                            f"{sorted(SAMPLING_FIELDS)} (and SGLang's {sorted(SAMPLING_ALIASES)})")
        if value is None:
            continue  # "not given" (SGLang's defaults are None): the field's default
        if field in out:
            raise TypeError(f"{where}: {_spellings(field)} name the same option: give one")
        out[field] = value
    if out.get("top_logprobs"):
        out.setdefault("logprobs", True)  # SGLang's top_logprobs_num implies return_logprob
    return out


def is_sampling_option(name: str) -> bool:
    return name in SAMPLING_FIELDS or name in SAMPLING_ALIASES or name in UNSUPPORTED


def dtype_regex(dtype: Any) -> str:
    """The regex of gen(dtype=...): int, float, bool or str (or their names)."""
    kind = DTYPE_NAMES.get(dtype, dtype) if isinstance(dtype, str) else dtype
    if kind not in DTYPE_REGEX:
        raise ValueError(f"gen(dtype={dtype!r}) is not supported: use int, float, bool or str "
                         "(or regex= / json_schema= for anything else)")
    return DTYPE_REGEX[kind]


def _spellings(field: str) -> str:
    names = [field, *(k for k, v in SAMPLING_ALIASES.items() if v == field)]
    return " / ".join(f"{n}=" for n in names)
