"""The DSL's building blocks: gen, select, image, the roles, and the default backend."""

from __future__ import annotations

import base64
import binascii
import io
import json
import os
import threading
from collections.abc import Sequence
from typing import Any

from radixrt.frontend.lang.ir import (
    Concat,
    Embed,
    Expr,
    Gen,
    Image,
    RoleBegin,
    RoleEnd,
    Select,
    ToolPrompt,
    as_expr,
)
from radixrt.frontend.lang.select_methods import SelectMethod, method_name
from radixrt.frontend.lang.sglang_names import (
    LORA,
    dtype_regex,
    sampling_fields,
    sampling_params_of,
)
from radixrt.frontend.lang.tools import tool_call_spec, tools_listing
from radixrt.runtime.messages import Scheduling


def gen(
    name: str | None = None,
    max_tokens: int | None = None,
    min_tokens: int | None = None,
    n: int | None = None,
    stop: str | Sequence[str] | None = None,
    stop_token_ids: Sequence[int] | None = None,
    stop_regex: Any = None,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    min_p: float | None = None,
    frequency_penalty: float | None = None,
    presence_penalty: float | None = None,
    ignore_eos: bool | None = None,
    return_logprob: bool | None = None,
    logprob_start_len: int | None = None,
    top_logprobs_num: int | None = None,
    return_text_in_logprobs: bool | None = None,
    dtype: Any = None,
    choices: Sequence[str] | None = None,
    choices_method: SelectMethod | str | None = None,
    regex: str | None = None,
    json_schema: Any = None,
    *,
    priority: int | None = None,
    lora: str | None = None,
    tools: Sequence[Any] | None = None,
    tool_choice: str = "required",
    parallel_tool_calls: bool = True,
    separate_reasoning: bool = False,
    **sampling: Any,
) -> Gen | Select:
    """Generate text (into variable `name`). Takes every SamplingParams field (max_tokens, stop,
    temperature, ...) with their defaults, the same at every entry point: max_tokens the rest of
    the context, at most 256; temperature 1.0. n must be 1 (use fork for several samples). Bad
    options raise here. The positional parameters are SGLang's, in its order, so
    `gen("x", 64, ...)` is max_tokens=64; SGLang's names work too (return_logprob,
    top_logprobs_num, logprob_start_len, max_new_tokens: sglang_names.py), and a parameter
    radixrt lacks (stop_regex) is refused by name. return_text_in_logprobs: the meta info's
    logprob entries are (logprob, token_id, token_text), the ids decoded with the backend's
    tokenizer.

    Constrained decoding (one of): regex= (the output matches it in full), json_schema= (a dict
    or JSON text: the output is JSON valid under it), choices= (the output is one of them),
    dtype= int | float | bool | str (a number, which also stops at a space or a newline, as in
    SGLang; True / False; or a quoted string); ebnf= / lark= (a context-free grammar in GBNF
    or Lark, as SamplingParams takes them).
    choices= with choices_method= (SGLang's gen-as-select) is `select(name, choices,
    choices_method=...)`: the choices scored, not decoded; it takes no other option.

    tools= (Python functions or JSON-schema tool dicts): the output is tool calls, well-formed
    by the runtime's grammar (in its tool-call format); the variable is a list of
    rx.ToolCall(name, arguments). tool_choice: "required" (the default: calls only), "auto"
    (text, or calls), or one tool's name; parallel_tool_calls=False: one call.

    separate_reasoning: on a runtime with --reasoning-parser, the variable is the answer and
    meta["reasoning"] the thinking (the transcript keeps both); constraints apply after it.

    priority: lower is more urgent in the runtime's queue (default: the run's, run(priority=...),
    itself 0 by default). lora="name": the gen runs under that LoRA adapter of the runtime
    (--lora-paths; default: the run's, run(lora=...), itself the base model)."""
    sglang_options = {
        "max_tokens": max_tokens, "min_tokens": min_tokens, "n": n, "stop": stop,
        "stop_token_ids": stop_token_ids, "stop_regex": stop_regex,
        "temperature": temperature, "top_p": top_p, "top_k": top_k, "min_p": min_p,
        "frequency_penalty": frequency_penalty, "presence_penalty": presence_penalty,
        "ignore_eos": ignore_eos, "return_logprob": return_logprob,
        "logprob_start_len": logprob_start_len, "top_logprobs_num": top_logprobs_num,
        "return_text_in_logprobs": return_text_in_logprobs,
    }
    if choices_method is not None:
        others = {**sglang_options, **sampling, "lora": lora, "dtype": dtype, "regex": regex,
                  "json_schema": json_schema, "tools": tools, "temperature": None}
        given = sorted(k for k, v in others.items() if v is not None)
        if given or separate_reasoning:
            raise TypeError("gen(choices=..., choices_method=...) is a select (the choices "
                            "scored, nothing generated): it takes none of "
                            f"{given or ['separate_reasoning']}")
        return select(name, choices, priority=priority, choices_method=choices_method,
                      temperature=temperature or 0.0)
    check_priority(priority)
    if not isinstance(separate_reasoning, bool):
        raise TypeError(f"separate_reasoning must be a bool, got {separate_reasoning!r}")
    sampling = sampling_fields({**sglang_options, **sampling, LORA: lora}, "gen()")
    if dtype is not None:
        if regex is not None:
            raise ValueError("give one of dtype= and regex= (dtype is a regex constraint)")
        regex, stops = dtype_regex(dtype)
        if stops:  # a number ends at a space or a newline, as in SGLang
            given_stops = sampling.get("stop", ())
            given_stops = [given_stops] if isinstance(given_stops, str) else list(given_stops)
            sampling["stop"] = given_stops + [s for s in stops if s not in given_stops]
    given = {k: v for k, v in (("regex", regex), ("json_schema", json_schema),
                                ("choices", choices)) if v is not None}
    if tools is not None:
        given["tool_calls"] = tool_call_spec(tools, tool_choice, parallel_tool_calls)[1]
    if len(given) > 1:
        raise ValueError(
            f"give at most one of regex=, json_schema=, choices=, tools= (got {sorted(given)})"
        )
    for kind, pattern in given.items():  # the constraint is a params field, as on the wire
        if kind == "choices":
            pattern = list(_check_choices(pattern))
        if kind == "json_schema" and not isinstance(pattern, str):
            pattern = json.dumps(pattern)
        sampling[kind] = pattern
    params = sampling_params_of(sampling)  # the runtime's checks: a ValueError naming the value
    if params.n != 1:
        raise ValueError(f"gen(n={params.n}) is not supported: fork the state to get n samples")
    return Gen(name, sampling, priority, separate_reasoning)


# gen_int / gen_string's positional parameters after the name, in SGLang's order
TYPED_GEN_POSITIONAL = (
    "max_tokens", "n", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p", "top_k",
    "min_p", "frequency_penalty", "presence_penalty", "ignore_eos", "return_logprob",
    "logprob_start_len", "top_logprobs_num", "return_text_in_logprobs",
)


def _typed(kind: str, args: tuple[Any, ...], options: dict[str, Any]) -> dict[str, Any]:
    if len(args) > len(TYPED_GEN_POSITIONAL):
        raise TypeError(f"{kind}() takes at most {len(TYPED_GEN_POSITIONAL) + 1} positional "
                        f"arguments ({len(args) + 1} given)")
    named = dict(zip(TYPED_GEN_POSITIONAL, args))
    twice = sorted(set(named) & set(options))
    if twice:
        raise TypeError(f"{kind}() got multiple values for {twice}")
    return {**named, **options}


def gen_int(name: str | None = None, *args: Any, **options: Any) -> Gen:
    """gen(name, dtype=int): an integer (SGLang's gen_int; its positional parameters after the
    name: TYPED_GEN_POSITIONAL)."""
    return gen(name, dtype=int, **_typed("gen_int", args, options))  # type: ignore[return-value]


def gen_string(name: str | None = None, *args: Any, **options: Any) -> Gen:
    """gen(name, dtype=str): a double-quoted string of letters, digits and spaces (SGLang's
    gen_string; positional parameters as gen_int's)."""
    return gen(name, dtype=str, **_typed("gen_string", args, options))  # type: ignore[return-value]


def select(
    name: str | None = None, choices: Sequence[str] | None = None, temperature: float = 0.0,
    choices_method: SelectMethod | str | None = None, *,
    method: str | SelectMethod = "token_length_normalized", priority: int | None = None,
) -> Select:
    """Append whichever of `choices` the model finds most likely here (and store it in `name`).
    The positional parameters are SGLang's: select(name, choices, temperature, choices_method).

    method: token_length_normalized (mean token log-probability; the default), greedy (best
    first token, ties broken by the next ones) or unconditional_likelihood_normalized (mean
    log-probability minus that of the choice on its own); SGLang's `choices_method=` objects
    (rx.greedy_token_selection, ...) say the same. priority: as gen's. temperature: SGLang's
    argument, where only 0 is meaningful (choices are scored, not sampled)."""
    if isinstance(temperature, (str, SelectMethod)):
        raise TypeError("select's third positional parameter is SGLang's temperature: give the "
                        f"method by name, method={temperature!r}")
    if temperature != 0.0:
        raise ValueError(f"select(temperature={temperature}) is not supported: select scores "
                         "every choice and takes the best; leave temperature out")
    if choices is None:
        raise ValueError("select needs choices: a non-empty list of strings")
    chosen = method_name(choices_method if choices_method is not None else method)
    check_priority(priority)
    return Select(name, _check_choices(choices), chosen, priority)


def _check_choices(choices: Any) -> tuple[str, ...]:
    if isinstance(choices, str) or not isinstance(choices, Sequence) or not choices:
        raise ValueError("choices must be a non-empty list of strings")
    if any(not isinstance(c, str) or not c for c in choices):
        raise ValueError(f"every choice must be a non-empty str, got {list(choices)!r}")
    return tuple(choices)


def embed(name: str | None = None, text: str | None = None, dimensions: int | None = None,
          *, priority: int | None = None) -> Embed:
    """Store in `name` the embedding (a list of floats) of `text`, or of the program's text so
    far when text is None -- its prefix is cached in the runtime, so only what is new is
    computed. Appends nothing. dimensions: keep the first N entries (Matryoshka; still unit
    length where the model normalizes). The runtime pools as its model says (radixrt serve
    reads sentence-transformers' files; a language model: its last token)."""
    if text is not None and (not isinstance(text, str) or not text):
        raise ValueError("embed's text must be a non-empty str, or None for the program's text")
    if dimensions is not None and (not isinstance(dimensions, int)
                                   or isinstance(dimensions, bool) or dimensions < 1):
        raise ValueError(f"dimensions={dimensions!r} must be an int >= 1, or None")
    check_priority(priority)
    return Embed(name, text, dimensions, priority)


def image(path_or_bytes: Any) -> Image:
    """An image at this point of the program: `s += rx.user(rx.image("cat.png") + "What is
    it?")`. A path (str or os.PathLike; the file is read here, on the client, so the program
    may run far from the runtime), the file's bytes, a data: URL, or a PIL image (sent as PNG).
    The text gets the model's image token at this place (what its chat template writes for an
    image), and every gen / select / fork whose text holds it sends the image with it. Needs a
    vision-language model on rx.Runtime / rx.RuntimeEndpoint; the runtime decodes the bytes
    under its media limits. SGLang's sgl.image."""
    ref = path_or_bytes
    if isinstance(ref, (bytes, bytearray, memoryview)):
        data, source = bytes(ref), ""
    elif isinstance(ref, str) and ref.startswith("data:"):
        data, source = _data_url(ref), ref[:40] + "..."
    elif isinstance(ref, str) and ref.startswith(("http://", "https://")):
        raise ValueError(f"image({ref!r}): give a local path or the image's bytes; fetch a URL "
                         "yourself, e.g. image(httpx.get(url).content)")
    elif isinstance(ref, (str, os.PathLike)):
        source = os.fspath(ref)
        with open(source, "rb") as f:  # a missing file: FileNotFoundError naming it
            data = f.read()
    elif callable(getattr(ref, "save", None)) and hasattr(ref, "mode"):  # a PIL image
        buffer = io.BytesIO()
        ref.save(buffer, format="PNG")
        data, source = buffer.getvalue(), ""
    else:
        raise TypeError(f"image() takes a path, bytes, a data: URL or a PIL image, not "
                        f"{type(ref).__name__}")
    if not data:
        raise ValueError(f"image({source or 'bytes'!r}): the image is empty")
    return Image(data, source)


def _data_url(url: str) -> bytes:
    head, comma, payload = url.partition(",")
    if not comma or not head.endswith(";base64"):
        raise ValueError(f"image(): a data: URL must be data:<mime>;base64,<data>, got "
                         f"{url[:40]!r}...")
    try:
        return base64.b64decode(payload, validate=True)
    except binascii.Error as exc:
        raise ValueError(f"image(): the data: URL's payload is not base64 ({exc})") from None


def check_priority(priority: Any) -> None:
    """Raise here, where the program names it, for a priority the runtime would refuse."""
    if priority is None:
        return
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise TypeError(f"priority must be an int (lower is more urgent), got {priority!r}")
    Scheduling(priority=priority)  # ValueError naming the range


def _role(role: str, content: Any) -> Expr:
    inside = () if content is None else (as_expr(content),)
    return Concat((RoleBegin(role), *inside, RoleEnd(role)))


def system(content: Any = None) -> Expr:
    """A system message: the model's chat template's markers around `content` (None: an empty
    message, as SGLang's `system()`)."""
    return _role("system", content)


def user(content: Any = None) -> Expr:
    """A user message: the model's chat template's markers around `content`."""
    return _role("user", content)


def assistant(content: Any = None) -> Expr:
    """An assistant message; put gen(...) inside to have the model write it."""
    return _role("assistant", content)


# SGLang's expressions for one marker: `s += rx.user_begin() + "..." + rx.user_end()`
def system_begin() -> Expr:
    return RoleBegin("system")


def system_end() -> Expr:
    return RoleEnd("system")


def user_begin() -> Expr:
    return RoleBegin("user")


def user_end() -> Expr:
    return RoleEnd("user")


def assistant_begin() -> Expr:
    return RoleBegin("assistant")


def assistant_end() -> Expr:
    return RoleEnd("assistant")


def tool(content: Any) -> Expr:
    """A tool's result, answering the calls of the assistant turn before it (the runtime's
    template markers: a user turn of <tool_response> blocks where the template has no tools)."""
    return _role("tool", content)


def tool_prompt(tools: Sequence[Any]) -> ToolPrompt:
    """The runtime's tool prompt for these tools (Python functions or tool dicts): what they
    are and how to call them, in the runtime's tool-call format. Put it in the system message:
    s += rx.system(rx.tool_prompt([get_weather]))."""
    tool_call_spec(tools)  # the same checks gen(tools=...) makes
    return ToolPrompt(tools_listing(tools))


class _DefaultBackend:
    """Where `set_default_backend` keeps the backend programs run on when given none: the one
    process-wide setting of the DSL, guarded by a lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._backend: Any = None

    def set(self, backend: Any) -> None:
        with self._lock:
            self._backend = backend

    def peek(self) -> Any:
        """The backend, or None when none is set."""
        with self._lock:
            return self._backend

    def get(self) -> Any:
        with self._lock:
            if self._backend is None:
                raise RuntimeError(
                    "no backend: call radixrt.set_default_backend(radixrt.Runtime()) or pass "
                    "backend= to run / run_batch"
                )
            return self._backend


DEFAULT_BACKEND = _DefaultBackend()


def set_default_backend(backend: Any) -> None:
    """Programs run on this backend unless run(..., backend=...) says otherwise."""
    DEFAULT_BACKEND.set(backend)


def flush_cache(backend: Any = None) -> int:
    """Drop every unlocked cached prefix of the (default) backend's runtime; the tokens freed."""
    return int((backend or DEFAULT_BACKEND.get()).flush_cache())


def get_server_info(backend: Any = None) -> dict[str, Any]:
    """The (default) backend's runtime counters and configuration (its /server_info)."""
    return dict((backend or DEFAULT_BACKEND.get()).info())
