"""`radixrt plan`: what a server for a model holds on a device of a given memory, from the model's
config alone (a config.json folder, a GGUF header, or "default"), without loading weights: the
weights, the KV pool the worker would make, and how many requests of a given shape run at once
with contiguous reservation, with paged allocation, and with a shared prefix
(worker/capacity.py does the arithmetic)."""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass, field
from typing import Any

from radixrt.config_flags import add_flags, as_flags, from_flags
from radixrt.runtime.config import EngineConfig

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
PLAN_DTYPES = tuple(sorted(DTYPE_BYTES))
_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1 << 10, "m": 1000**2, "mb": 1000**2,
          "mib": 1 << 20, "g": 1000**3, "gb": 1000**3, "gib": 1 << 30, "t": 1000**4,
          "tb": 1000**4, "tib": 1 << 40}
# the server's flags `radixrt plan` takes too, validated as the server validates them
ENGINE_FIELDS = ("model", "page_size", "mem_fraction", "context_length", "weight_format",
                 "quantization")
# bytes per weight of --quantization's formats (codes, and a float16 scale and bias per 32)
QUANTIZED_BYTES = {"int8": 1 + 4 / 32, "int4": 0.5 + 4 / 32}


def parse_memory(text: str) -> int:
    """"80GiB", "24 GB", "512MiB", "1e9" -> bytes; ValueError naming the units."""
    found = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-zA-Z]*)\s*", text)
    unit = found.group(2).lower() if found else None
    if found is None or unit not in _UNITS:
        raise ValueError(f"--memory={text!r}: give a size such as 80GiB, 24GB or 512MiB")
    size = int(float(found.group(1)) * _UNITS[unit])
    if size <= 0:
        raise ValueError(f"--memory={text!r} must be more than 0")
    return size


@dataclass(frozen=True)
class PlanOptions:
    """`radixrt plan`'s own flags (the device and the workload), validated once."""

    memory: str = field(metadata={
        "help": "device memory, e.g. 80GiB (the weights come off it)"})
    dtype: str = field(default="bfloat16", metadata={
        "choices": PLAN_DTYPES, "help": "of the weights and the KV cache"})
    prompt_tokens: int = field(default=512, metadata={"help": "of each request"})
    mean_output_tokens: int = field(default=256, metadata={"help": "of each request, on average"})
    max_output_tokens: int = field(default=1024, metadata={
        "help": "of each request at most (what contiguous reservation sets aside)"})
    shared_prefix_tokens: int = field(default=0, metadata={
        "help": "of the prompt, the same for every request (a system prompt, few-shot examples)"})
    requests: int = field(default=64, metadata={"help": "requests that share that prefix"})
    host_memory: str | None = field(default=None, metadata={
        "help": "host memory for a host KV tier, e.g. 256GiB: how many tokens it holds "
        "(--host-cache-tokens)"})
    disk_space: str | None = field(default=None, metadata={
        "help": "disk space for a disk KV tier, e.g. 2TB: how many tokens it holds "
        "(--disk-cache-tokens)"})
    json: bool = field(default=False, metadata={"help": "print the figures as JSON"})

    def __post_init__(self) -> None:
        parse_memory(self.memory)
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"PlanOptions.dtype={self.dtype!r} is invalid: use one of "
                             f"{PLAN_DTYPES}")
        for name in ("prompt_tokens", "mean_output_tokens", "max_output_tokens",
                     "shared_prefix_tokens"):
            if getattr(self, name) < 0:
                raise ValueError(f"PlanOptions.{name}={getattr(self, name)} is invalid: must be "
                                 ">= 0")
        if self.requests < 1:
            raise ValueError(f"PlanOptions.requests={self.requests} is invalid: must be >= 1")
        for name in ("host_memory", "disk_space"):
            if getattr(self, name) is not None:
                parse_memory(getattr(self, name))

    @property
    def memory_bytes(self) -> int:
        return parse_memory(self.memory)


def add_plan_parser(sub: Any) -> None:
    plan = sub.add_parser(
        "plan", help="KV capacity and concurrency for a model on a device, without loading it",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_flags(plan, EngineConfig, "the server's flags (only the model's config is read)",
              only=ENGINE_FIELDS)
    add_flags(plan, PlanOptions, "the device and the workload")


def run_plan(args: argparse.Namespace) -> int:
    from radixrt.runtime.models.loader import inspect_model
    from radixrt.runtime.worker.capacity import Workload, plan, tier_tokens

    try:
        engine = from_flags(EngineConfig, args, only=ENGINE_FIELDS)
        options = from_flags(PlanOptions, args)
        config = inspect_model(engine.model)
        memory = options.memory_bytes
        context = engine.context_length or config.max_position_embeddings
        work = Workload(options.prompt_tokens, options.mean_output_tokens,
                        options.max_output_tokens, options.shared_prefix_tokens,
                        options.requests)
        dtype_bytes = DTYPE_BYTES[options.dtype]
        figures = plan(config, memory, dtype_bytes, engine.page_size, engine.mem_fraction,
                       context, work, held_weight_bytes(engine, config, dtype_bytes))
        host, disk = (parse_memory(v) if v else 0
                      for v in (options.host_memory, options.disk_space))
        figures["host_tier_tokens"], figures["disk_tier_tokens"] = tier_tokens(
            figures["kv_bytes_per_token"], engine.page_size, host, disk)
    except (ValueError, OSError) as exc:
        print(f"radixrt plan: {as_flags(str(exc), (EngineConfig, PlanOptions))}",
              file=sys.stderr)
        return 2
    if options.json:
        print(json.dumps({"model": engine.model, "memory_bytes": memory, "dtype": options.dtype,
                          "context_length": context, **figures}, indent=2))
    else:
        print(report(args, config.architecture, memory, context, figures))
    return 0


def held_weight_bytes(engine: EngineConfig, config: Any, dtype_bytes: int) -> int | None:
    """The weights' bytes as a server would hold them, from the header alone: a GGUF file's
    projections, embedding and head packed where their type has a packed form (weight_format
    packed or auto; experts and norms as floats), a float checkpoint's quantized at load
    (--quantization). None: every weight a float (plan counts the parameters)."""
    import math

    from radixrt.runtime.models.gguf_file import GGUFFile
    from radixrt.runtime.models.loader import resolve_model_path
    from radixrt.runtime.models.packed_gguf import packed_nbytes
    from radixrt.runtime.worker.capacity import parameter_count, projection_parameters

    folder, fname = resolve_model_path(engine.model)
    if fname is not None and engine.weight_format != "dequantized":
        total = 0
        for name, info in GGUFFile(f"{folder}/{fname}").tensors.items():
            packed = packed_nbytes(info.qtype, *info.shape) if (
                len(info.shape) == 2 and "_exps" not in name) else None
            total += packed if packed is not None else math.prod(info.shape) * dtype_bytes
        return total
    if fname is None and engine.quantization is not None:
        floats = parameter_count(config)
        tables = config.vocab_size * config.hidden_size * (
            1 if config.tie_word_embeddings else 2)
        projections = projection_parameters(config)
        return int(projections * QUANTIZED_BYTES[engine.quantization]
                   + tables * QUANTIZED_BYTES["int8"]
                   + (floats - projections - tables) * dtype_bytes)
    return None


def held(args: argparse.Namespace) -> str:
    """How the weights are counted, for the report's first line."""
    quantization = getattr(args, "quantization", None)
    if quantization:
        return f"{quantization}, quantized at load; the rest {args.dtype}"
    gguf = str(args.model).endswith(".gguf") or args.model == "default"
    if gguf and getattr(args, "weight_format", "auto") != "dequantized":
        return f"packed as the GGUF file's blocks; the rest {args.dtype}"
    return args.dtype


def report(args: argparse.Namespace, architecture: str, memory: int, context: int,
           f: dict[str, Any]) -> str:
    gib = 1 << 30
    lines = [
        f"model {args.model} ({architecture}): {f['parameters'] / 1e9:.2f} B parameters, "
        f"{f['weight_bytes'] / gib:.2f} GiB of weights ({held(args)})",
        *([f"mixture of experts: {f['expert_parameters'] / 1e9:.2f} B parameters in experts, "
           f"{f['active_parameters'] / 1e9:.2f} B active per token"]
          if f["expert_parameters"] else []),
        f"KV cache: {f['kv_bytes_per_token']} bytes per token "
        f"({f['kv_bytes_per_token'] / 1024:.0f} KiB; {f['kv_per_token']} x {args.dtype})",
        f"pool: {args.mem_fraction} of the {(memory - f['weight_bytes']) / gib:.2f} GiB left "
        f"= {f['pool_pages']} pages of {args.page_size} = {f['pool_tokens']} tokens "
        f"({f['pool_bytes'] / gib:.2f} GiB)",
        f"requests of {args.prompt_tokens} prompt + {args.mean_output_tokens} mean / "
        f"{args.max_output_tokens} max output tokens, at once:",
        f"  contiguous reservation (prompt + max output each): {f['concurrent_contiguous']}",
        f"  paged (prompt + mean output each):                 {f['concurrent_paged']}",
        f"  paged, every request at its maximum output:        "
        f"{f['concurrent_paged_worst_case']}",
    ]
    if args.shared_prefix_tokens:
        lines += [
            f"  paged, a {args.shared_prefix_tokens}-token prefix held once:"
            f"{'':>{max(1, 17 - len(str(args.shared_prefix_tokens)))}}"
            f"{f['concurrent_paged_shared_prefix']}",
            f"prefill saved by the shared prefix over {args.requests} requests: "
            f"{f['prefill_tokens_saved']} tokens ({f['prefill_fraction_saved']:.0%} of the "
            "prompts)",
        ]
    lines.append(f"at the context length ({context} tokens per request): "
                 f"{f['max_concurrency_at_context_length']} at once")
    for name, flag, key, size in (("host", "--host-cache-tokens", "host_tier_tokens",
                                   args.host_memory),
                                  ("disk", "--disk-cache-tokens", "disk_tier_tokens",
                                   args.disk_space)):
        if size:
            lines.append(f"{name} KV tier in {size}: {f[key]} tokens ({flag} {f[key]}), "
                         f"{f[key] // max(args.prompt_tokens, 1)} prompts of "
                         f"{args.prompt_tokens} tokens kept beside the pool's "
                         f"{f['pool_tokens'] // max(args.prompt_tokens, 1)}")
    return "\n".join(lines)
