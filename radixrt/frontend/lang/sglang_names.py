"""SGLang's spellings, accepted beside radixrt's own, so that a program written for SGLang's
frontend runs with only its import changed (`import radixrt as sgl`). radixrt's names stay the
primary ones; the "Coming from SGLang" table of docs/dsl.md lists every alias here.

Sampling options (of `gen` and of `run` / `run_batch` / a direct call) are translated to
SamplingParams fields by `sampling_fields`; `dtype=` becomes a regex constraint (`DTYPE_REGEX`,
the patterns SGLang's runtime backend uses, with its stop strings for numbers); SGLang options
radixrt does not have are refused with a message that names them and says what to use instead.
`DSL_OPTIONS` are options of the DSL itself (not SamplingParams fields): they travel in a gen's
params and the executor or the backend takes them out (`return_text_in_logprobs`: decode
the token ids of the meta info's logprob entries; `lora`: the LoRA adapter the gen runs under,
which the backend sends as its request's adapter). `REGEX_INT` ... `REGEX_STR` are
sglang.lang.ir's regex building blocks, with SGLang's exact values (`radixrt.lang.ir` exports
them).
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
    "min_new_tokens": "min_tokens",
}
# the DSL's own options (a gen's or a run's): not sent to the runtime
TOKEN_TEXTS = "return_text_in_logprobs"  # logprob entries (logprob, token_id, token_text)
LORA = "lora"  # the name of the LoRA adapter the gen runs under (the backend's request field)
DSL_OPTIONS = frozenset({TOKEN_TEXTS, LORA})
# sglang.lang.ir's regex building blocks, SGLang's values (an int or a float may end in spaces
# and newlines)
REGEX_INT = r"[-+]?[0-9]+[ \n]*"
REGEX_FLOAT = r"[-+]?[0-9]*\.?[0-9]+[ \n]*"
REGEX_BOOL = r"(True|False)"
REGEX_STR = r"\"[\w\d\s]*\""
# gen(dtype=...): SGLang's runtime-backend rule. The output matches the pattern in full, and
# an int or float also stops at a space or a newline (which its pattern allows after the
# number, and which, a stop string, is not part of the output): so the value parses as the type
# and the model can end it without an end-of-sequence token
DTYPE_REGEX: dict[Any, str] = {int: REGEX_INT, float: REGEX_FLOAT, bool: REGEX_BOOL,
                               str: REGEX_STR}
DTYPE_STOPS: dict[Any, tuple[str, ...]] = {int: (" ", "\n"), float: (" ", "\n")}
DTYPE_NAMES = {"int": int, "float": float, "bool": bool, "str": str}
# SGLang options radixrt does not take, and what to do instead
UNSUPPORTED = {
    "stop_regex": "radixrt's runtime stops on strings and token ids (stop=, stop_token_ids=); "
                  "constrain the whole output with regex= instead",
    "video": "radixrt takes images (image(path_or_bytes) in the text), not video",
    "spaces_between_special_tokens": "radixrt has no such option",
}
SAMPLING_FIELDS = frozenset(SamplingParams.__struct_fields__)


def sampling_fields(options: dict[str, Any], where: str) -> dict[str, Any]:
    """SamplingParams fields (and DSL_OPTIONS) from options spelled radixrt's way or SGLang's.
    An option given as None is not given (SGLang's defaults are None). Raises TypeError for an
    option neither knows, or one SGLang has and radixrt does not (naming it)."""
    out: dict[str, Any] = {}
    for name, value in options.items():
        field = SAMPLING_ALIASES.get(name, name)
        known = field in SAMPLING_FIELDS or name in UNSUPPORTED or name in DSL_OPTIONS
        if not known:
            raise TypeError(f"{where} got unknown option(s) [{name!r}]; options: "
                            f"{sorted(SAMPLING_FIELDS)} (and SGLang's "
                            f"{sorted([*SAMPLING_ALIASES, *DSL_OPTIONS])})")
        if value is None:
            continue  # "not given": the field's default
        if name in UNSUPPORTED:
            raise TypeError(f"{where}: SGLang's {name}= is not supported here: "
                            f"{UNSUPPORTED[name]}")
        if name == TOKEN_TEXTS and not isinstance(value, bool):
            raise TypeError(f"{where}: {name} must be a bool, got {value!r}")
        if name == LORA and not isinstance(value, str):
            raise TypeError(f"{where}: {name} must be a LoRA adapter's name, got {value!r}")
        if field in out:
            raise TypeError(f"{where}: {_spellings(field)} name the same option: give one")
        out[field] = value
    if out.get("top_logprobs"):
        out.setdefault("logprobs", True)  # SGLang's top_logprobs_num implies return_logprob
    return out


def is_sampling_option(name: str) -> bool:
    return (name in SAMPLING_FIELDS or name in SAMPLING_ALIASES or name in UNSUPPORTED
            or name in DSL_OPTIONS)


def sampling_params_of(options: dict[str, Any]) -> SamplingParams:
    """The SamplingParams of sampling_fields' output (DSL_OPTIONS left out): the runtime's own
    checks, a ValueError naming a bad value."""
    return SamplingParams(**{k: v for k, v in options.items() if k not in DSL_OPTIONS})


def dtype_regex(dtype: Any) -> tuple[str, tuple[str, ...]]:
    """The regex of gen(dtype=...) (int, float, bool or str, or their names) and the stop
    strings it adds."""
    kind = DTYPE_NAMES.get(dtype, dtype) if isinstance(dtype, str) else dtype
    if kind not in DTYPE_REGEX:
        raise ValueError(f"gen(dtype={dtype!r}) is not supported: use int, float, bool or str "
                         "(or regex= / json_schema= for anything else)")
    return DTYPE_REGEX[kind], DTYPE_STOPS.get(kind, ())


def _spellings(field: str) -> str:
    names = [field, *(k for k, v in SAMPLING_ALIASES.items() if v == field)]
    return " / ".join(f"{n}=" for n in names)
