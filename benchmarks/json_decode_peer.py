"""The outlines + HF transformers side of `json_decode.py`, run in its own venv (see
`json_decode.py --install-outlines`): it must not import radixrt, which is not installed there.

Reads one JSON request on stdin, writes one JSON result on stdout; progress goes to stderr.
Request: {"model_folder", "gguf_file", "messages": [str, ...] (user messages, formatted with the
model's chat template by outlines), "schema": dict, "max_tokens": int, "batch_size": int
(0 = all prompts in one outlines batch call, 1 = one prompt at a time), "threads": int,
"whitespace_pattern": str | null, "flush_denormal": bool}.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def log(message: str) -> None:
    print(f"[outlines peer] {message}", file=sys.stderr, flush=True)


def generated_lengths(new_ids: Any, eos_ids: set[int]) -> list[int]:
    """Tokens each row really generated: up to and including its first EOS (the rest is padding
    HF adds once a row has finished while others go on)."""
    lengths = []
    for row in new_ids.tolist():
        n = next((i + 1 for i, t in enumerate(row) if t in eos_ids), len(row))
        lengths.append(n)
    return lengths


def run(req: dict[str, Any]) -> dict[str, Any]:
    from importlib.metadata import version

    import outlines
    import torch
    import transformers
    from outlines.inputs import Chat
    from outlines.types import JsonSchema
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if req.get("flush_denormal", True):  # as the radixrt side: before any worker thread starts
        torch.set_flush_denormal(True)
    torch.set_num_threads(int(req["threads"]))
    start = time.perf_counter()
    folder, fname = req["model_folder"], req["gguf_file"]
    hf = AutoModelForCausalLM.from_pretrained(folder, gguf_file=fname, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=fname)
    load_s = time.perf_counter() - start
    log(f"loaded the model in {load_s:.1f} s")

    forward_calls = [0]
    hf.register_forward_hook(lambda *_: forward_calls.__setitem__(0, forward_calls[0] + 1))
    captured: list[Any] = []  # every tensor model.generate returns: [batch, prompt + new]
    generate = hf.generate

    def capturing_generate(*args: Any, **kwargs: Any) -> Any:
        out = generate(*args, **kwargs)
        captured.append((out, kwargs["input_ids"].shape[1]))
        return out

    hf.generate = capturing_generate
    model = outlines.from_transformers(hf, tokenizer)

    start = time.perf_counter()
    output_type = JsonSchema(req["schema"], whitespace_pattern=req["whitespace_pattern"])
    generator = outlines.Generator(model, output_type)  # compiles the schema's index once
    compile_s = time.perf_counter() - start
    log(f"compiled the JSON schema in {compile_s:.1f} s")

    chats = [Chat([{"role": "user", "content": m}]) for m in req["messages"]]
    prompts = [model.type_adapter.format_input(c) for c in chats]
    prompt_ids = [tokenizer(p, add_special_tokens=True)["input_ids"] for p in prompts]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    kwargs = {"max_new_tokens": int(req["max_tokens"]), "do_sample": False, "pad_token_id": pad}
    batch = int(req["batch_size"]) or len(chats)

    generator(chats[0], **{**kwargs, "max_new_tokens": 4})  # warm-up
    captured.clear()
    forward_calls[0] = 0
    texts: list[str] = []
    start = time.perf_counter()
    for lo in range(0, len(chats), batch):
        part = chats[lo : lo + batch]
        if batch == 1:
            texts.append(generator(part[0], **kwargs))
        else:
            texts += generator.batch(part, **kwargs)
    seconds = time.perf_counter() - start
    configured = getattr(hf.generation_config, "eos_token_id", None)
    configured = configured if isinstance(configured, list) else [configured]
    eos = {t for t in (tokenizer.eos_token_id, *configured) if t is not None}
    token_ids: list[list[int]] = []
    for out, width in captured:
        new = out[:, width:]
        token_ids += [row[:n] for row, n in zip(new.tolist(), generated_lengths(new, eos))]
    return {
        "texts": texts,
        "token_ids": token_ids,
        "prompt_ids": prompt_ids,
        "seconds": seconds,
        "forward_calls": forward_calls[0],
        "compile_s": compile_s,
        "load_s": load_s,
        "mode": f"batched ({batch} prompts per call)" if batch > 1 else "one prompt at a time",
        "versions": {"outlines": version("outlines"), "outlines_core": version("outlines_core"),
                     "transformers": transformers.__version__, "torch": torch.__version__},
    }


def main() -> None:
    req = json.load(sys.stdin)
    out = sys.stdout
    sys.stdout = sys.stderr  # anything a library prints must not corrupt the JSON answer
    result = run(req)
    out.write(json.dumps(result))
    out.flush()


if __name__ == "__main__":
    main()
