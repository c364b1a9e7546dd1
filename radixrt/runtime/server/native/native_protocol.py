"""The native API's wire shapes: SGLang's `/generate` protocol (its io_struct GenerateReqInput and
the meta_info its server returns), with radixrt's own names kept as aliases.

A request: "text" (a string or a batch of strings) or "input_ids" (ids or a batch of them),
"sampling_params" (one dict, or one per prompt of a batch) in SGLang's names (max_new_tokens,
min_new_tokens, sampling_seed, ...) or radixrt's (max_tokens, min_tokens, seed, ...),
"rid" (the request's id, one per prompt of a batch), "return_logprob", "logprob_start_len",
"top_logprobs_num" (each one value or one per prompt), "return_text_in_logprobs", "stream", and
radixrt's "pin" and scheduling fields, and "image_data" (a vision-language model's images: per
prompt one or a list of data: / http(s) URLs, base64 or paths, core/image_parts.py). SGLang
fields radixrt does not serve (video, audio, sessions, hidden states, ...) are accepted only at
their "off" value (null, false, 0, empty), which is what SGLang's own clients send when they do
not use them; any other value is a 400 naming the field. An unknown field is a 400 too: nothing
is accepted and ignored.

meta_info as SGLang shapes it: "id", "finish_reason" ({"type": "stop", "matched": the stop string
or token id} | {"type": "length", "length": N} | {"type": "abort", "message": ...} | null while
running), "prompt_tokens", "completion_tokens", "cached_tokens", and with return_logprob
"input_token_logprobs" / "output_token_logprobs" as [logprob, token id, text or null] triples
(the first input entry's logprob is null: nothing conditions it), "output_token_logprobs_length",
and with top_logprobs_num "input_top_logprobs" / "output_top_logprobs" (per position a list of
triples, null where there is none).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from radixrt.runtime.config import INT64_MAX, INT64_MIN, MAX_NAME_CHARS
from radixrt.runtime.messages import TokenLogprob
from radixrt.runtime.sampling_params import SamplingParams
from radixrt.runtime.server.core.error_shapes import APIError
from radixrt.runtime.server.openai.openai_protocol import parse_logit_bias

MAX_RID_CHARS = 128  # a client-chosen request id (SGLang's rid)
SAMPLING_FIELDS = frozenset(SamplingParams.__struct_fields__)
# SGLang's sampling_params name -> radixrt's SamplingParams field
SAMPLING_ALIASES = {
    "max_new_tokens": "max_tokens",
    "min_new_tokens": "min_tokens",
    "sampling_seed": "seed",
}
# SGLang sampling_params radixrt does not serve, with the values that mean "not used"
SAMPLING_OFF: dict[str, tuple[Any, ...]] = {
    "spaces_between_special_tokens": (True,),  # radixrt's detokenizer joins special tokens as is
    "no_stop_trim": (False,),
    "stop_regex": (None, [], ""),
    "structural_tag": (None,),
    "stream_interval": (None,),
    "custom_params": (None, {}),
    "watermark": (None,),
    "beam_width": (None,),
}

Int64 = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)]
Rid = Annotated[str, Field(min_length=1, max_length=MAX_RID_CHARS)]
LoraName = Annotated[str, Field(max_length=MAX_NAME_CHARS)]


class ImageDataIn(BaseModel):
    """SGLang's ImageData: an image's URL (its detail accepted and ignored)."""

    url: str
    detail: str | None = Field(default=None, max_length=MAX_NAME_CHARS)


ImageItem = str | ImageDataIn


class GenerateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    text: str | list[str] | None = None
    input_ids: list[Int64] | list[list[Int64]] | None = None
    sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None
    rid: Rid | list[Rid] | None = None
    return_logprob: bool | list[bool] | None = None
    logprob_start_len: Int64 | list[Int64] | None = None
    top_logprobs_num: Int64 | list[Int64] | None = None
    return_text_in_logprobs: bool = False
    stream: bool = False
    pin: bool = False
    # scheduling, as on the OpenAI endpoints: see tenants.scheduling_for
    priority: int | None = None
    cache_salt: str | None = Field(default=None, max_length=MAX_NAME_CHARS)
    timeout: float | None = None
    user: str | None = Field(default=None, max_length=MAX_NAME_CHARS)
    # the LoRA adapter's name (SGLang's field; a list gives one per prompt, all the same here)
    lora_path: LoraName | list[LoraName | None] | None = None
    # per prompt an image or a list of them (a batch: one entry per prompt)
    image_data: ImageItem | list[ImageItem | list[ImageItem] | None] | None = None
    # SGLang's fields that radixrt does not serve: only their "off" values (see unused_fields)
    video_data: Any = None
    audio_data: Any = None
    input_embeds: Any = None
    lora_id: Any = None
    session_id: Any = None
    session_params: Any = None
    custom_logit_processor: Any = None
    token_ids_logprob: Any = None
    return_hidden_states: Any = False
    return_routed_experts: Any = False
    return_prompt_token_ids: Any = False
    log_metrics: Any = True
    modalities: Any = None
    bootstrap_host: Any = None
    bootstrap_port: Any = None
    bootstrap_room: Any = None
    data_parallel_rank: Any = None
    background: Any = False
    extra_key: Any = None


# GenerateRequest fields and the value that means "not used", beside the one it has by default
UNSERVED_OFF: dict[str, tuple[Any, ...]] = {
    "video_data": (None, []), "audio_data": (None, []),
    "input_embeds": (None,), "lora_id": (None, [], ""),
    "session_id": (None, ""), "session_params": (None, {}), "custom_logit_processor": (None,),
    "token_ids_logprob": (None, []), "return_hidden_states": (False,),
    "return_routed_experts": (False,), "return_prompt_token_ids": (False,),
    "log_metrics": (True, False), "modalities": (None, []), "bootstrap_host": (None,),
    "bootstrap_port": (None,), "bootstrap_room": (None,), "data_parallel_rank": (None,),
    "background": (False,), "extra_key": (None, ""),
}


class AbortRequestBody(BaseModel):
    """SGLang's /abort_request: one request by its id, or every running one."""

    model_config = ConfigDict(extra="forbid")
    rid: Rid | None = None
    abort_all: bool = False


class ConcatAppendBody(BaseModel):
    """/concate_and_append_request: append the source requests' tokens to the destination's."""

    model_config = ConfigDict(extra="forbid")
    src_rids: Annotated[list[Rid], Field(min_length=1, max_length=64)]
    dst_rid: Rid
    # the scheduling fields of /generate: the ids are looked up in this tenant and cache_salt
    priority: int | None = None
    cache_salt: str | None = Field(default=None, max_length=MAX_NAME_CHARS)
    timeout: float | None = None
    user: str | None = Field(default=None, max_length=MAX_NAME_CHARS)


class ConcatAppended(BaseModel):
    success: Literal[True]
    dst_rid: str
    prompt_tokens: int
    cached_tokens: int


def check_unserved(body: GenerateRequest) -> None:
    """A field SGLang has and radixrt does not serve is refused unless it says "not used"."""
    for name, off in UNSERVED_OFF.items():
        value = getattr(body, name)
        if not is_off(value, off):
            raise APIError(f"'{name}' is not supported by radixrt (no video, audio, "
                           f"sessions or hidden states): leave it out", param=name)


def is_off(value: Any, off: tuple[Any, ...]) -> bool:
    """value is one of the "not used" values (of the same type: 1 is not True)."""
    return any(value == v and type(value) is type(v) for v in off)


def sampling_values(values: dict[str, Any]) -> dict[str, Any]:
    """SamplingParams keyword values from a sampling_params dict in SGLang's or radixrt's names.
    Raises APIError naming an unknown field, one SGLang has that radixrt does not serve (with a
    value other than its "off" one), or one option given under both names."""
    out: dict[str, Any] = {}
    for name, value in values.items():
        if name in SAMPLING_OFF:
            if not is_off(value, SAMPLING_OFF[name]):
                raise APIError(f"sampling_params.{name}={value!r} is not supported by radixrt "
                               f"(only {' / '.join(map(repr, SAMPLING_OFF[name]))}): leave it "
                               "out",
                               param=f"sampling_params.{name}")
            continue
        field = SAMPLING_ALIASES.get(name, name)
        if field not in SAMPLING_FIELDS:
            raise APIError(f"unknown sampling_params field {name!r}; known fields: "
                           f"{sorted(SAMPLING_FIELDS | set(SAMPLING_ALIASES))}",
                           param="sampling_params")
        if field in out:
            raise APIError(f"sampling_params names {field} twice (as {name!r} and its alias): "
                           "give one", param=f"sampling_params.{name}")
        if value is None:
            continue  # SGLang's clients send null for "the default"
        out[field] = value
    if isinstance(out.get("logit_bias"), dict):
        out["logit_bias"] = parse_logit_bias(out["logit_bias"])
    if isinstance(out.get("stop_token_ids"), list | set):
        out["stop_token_ids"] = tuple(out["stop_token_ids"])
    return out


def per_prompt(value: Any, count: int, name: str, batch: bool) -> list[Any]:
    """A field given once for all prompts, or once per prompt (a list as long as the batch)."""
    if isinstance(value, list):
        if not batch:
            raise APIError(f"'{name}' is a list, but the request has one prompt", param=name)
        if len(value) != count:
            raise APIError(f"'{name}' has {len(value)} entries for {count} prompts", param=name)
        return value
    return [value] * count


# --- meta_info -----------------------------------------------------------------------------


def finish_reason(reason: str | None, matched_stop: str | None, token_ids: list[int],
                  stop_ids: frozenset[int]) -> dict[str, Any] | None:
    """SGLang's finish_reason object from radixrt's string. stop_ids: the ids that end a sample
    (EOS and the request's stop_token_ids): "matched" is the one that did."""
    if reason is None:
        return None
    if reason == "stop":
        if matched_stop is not None:
            return {"type": "stop", "matched": matched_stop}
        last = token_ids[-1] if token_ids else None
        return {"type": "stop", "matched": last if last in stop_ids else None}
    if reason == "length":
        return {"type": "length", "length": len(token_ids)}
    if reason == "abort":
        return {"type": "abort", "message": "aborted"}
    return {"type": "abort", "message": reason}


def logprob_triples(entries: list[tuple[float | None, int]],
                    text_of: Any | None) -> list[list[Any]]:
    """[logprob, token id, text or None] per entry (text_of: token id -> text, or None)."""
    return [[lp, tid, text_of(tid) if text_of is not None else None] for lp, tid in entries]


def top_triples(items: list[TokenLogprob | None], text_of: Any | None) -> list[Any]:
    return [None if item is None or not item.top
            else logprob_triples([(lp, tid) for tid, lp in item.top], text_of)
            for item in items]
