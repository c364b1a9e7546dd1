"""JSON extraction with a JSON schema: radixrt with and without jump-forward, and `outlines`
driving Hugging Face transformers, on the same model and the same passages, greedy.

Each passage is a made-up two-sentence biography; every system must answer with JSON under SCHEMA
(compact: no whitespace). radixrt runs all passages as one batch, with jump-forward (the forced
keys and punctuation are appended without model steps) and without it (one step per token; the
outputs are token-identical). outlines (1.x, its default outlines_core backend) runs HF
transformers in its own venv (benchmarks/.outlines-venv), as one outlines batch call by default.

    python benchmarks/json_decode.py                       # 32 passages, all three systems
    python benchmarks/json_decode.py --quick               # 8 passages, small max_tokens
    python benchmarks/json_decode.py --skip-outlines       # radixrt only
    python benchmarks/json_decode.py --install-outlines    # create benchmarks/.outlines-venv first
    python benchmarks/json_decode.py --grammar-backend outlines   # radixrt on outlines-core too

Reported per system: outputs/s, output tokens/s, model forward steps and generated tokens per
step (summed over the batch: every sequence in a step counts), the share of outputs that are valid
JSON under the schema (json.loads + jsonschema.validate), and the share of fields equal to the
passage's facts. Both processes flush denormal floats to zero (--no-flush-denormal: don't): on
this CPU, HF's forward pass otherwise runs many times slower. The schema's strings have a
maxLength so that every output ends within max_tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from importlib.metadata import version
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jsonschema  # noqa: E402
import torch  # noqa: E402
from plots import add_plot_dir, bar_panels, plot_path  # noqa: E402

import radixrt  # noqa: E402
from radixrt.runtime.config import DEFAULT_GRAMMAR_BACKEND, GRAMMAR_BACKENDS  # noqa: E402
from radixrt.runtime.models.loader import default_model_path, load_model  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
OUTLINES_VENV = os.path.join(HERE, ".outlines-venv")
PEER_SCRIPT = os.path.join(HERE, "json_decode_peer.py")
OUTLINES_PACKAGES = ("gguf", "accelerate", "outlines", "jsonschema")  # + torch, transformers pinned
PEER_TIMEOUT_S = 3600.0
RT_JF, RT_NO_JF, OUTLINES = "radixrt-jf", "radixrt-no-jf", "outlines+hf"

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"type": "string", "maxLength": 24},
        "occupation": {"type": "string", "maxLength": 24},
        "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 24}, "maxItems": 3},
    },
    "required": ["name", "age", "city", "occupation", "hobbies"],
    "additionalProperties": False,
}
INSTRUCTION = (  # one example keeps the small model's strings short
    "Extract the person's name, age, city, occupation and hobbies from the text as JSON.\n\n"
    "Example text: Ana Ruiz, 52, is a chef in Madrid who likes tennis and reading.\n"
    'Example JSON: {"name":"Ana Ruiz","age":52,"city":"Madrid","occupation":"chef",'
    '"hobbies":["tennis","reading"]}\n\nText: ')

# --- passages ----------------------------------------------------------------------------------
PEOPLE = [("Maria Lopez", "she"), ("Tom Becker", "he"), ("Aiko Tanaka", "she"),
          ("Samuel Okafor", "he"), ("Lena Novak", "she"), ("Ravi Sharma", "he"),
          ("Claire Dubois", "she"), ("Jonas Berg", "he"), ("Fatima Haddad", "she"),
          ("Lucas Moreau", "he"), ("Nina Petrova", "she"), ("Omar Farouk", "he"),
          ("Grace Kim", "she"), ("Pedro Alves", "he"), ("Hannah Weiss", "she"),
          ("Ethan Clarke", "he")]
CITIES = ["Lisbon", "Hamburg", "Osaka", "Lagos", "Prague", "Pune", "Lyon", "Bergen", "Beirut",
          "Marseille", "Kazan", "Cairo", "Busan", "Porto", "Vienna", "Leeds"]
OCCUPATIONS = ["nurse", "carpenter", "architect", "teacher", "engineer", "baker", "pilot",
               "librarian", "pharmacist", "journalist", "electrician", "accountant"]
HOBBIES = ["hiking", "chess", "baking", "painting", "cycling", "gardening", "photography",
           "swimming", "knitting", "pottery", "running", "fishing"]
TEMPLATES = [
    "{name} is a {age}-year-old {occ} who lives in {city}. On weekends {p} enjoys {hobbies}.",
    "{name}, {age}, works as {a_occ} in {city}. Outside work, {p} loves {hobbies}.",
    "Meet {name}, {a_occ} from {city}. {P} is {age} years old and {p} spends {pp} free time on "
    "{hobbies}.",
    "At {age}, {name} has been {a_occ} in {city} for years. {P} relaxes with {hobbies}.",
]


@dataclass
class Passage:
    text: str
    facts: dict[str, Any]


def english_list(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def make_passages(n: int, seed: int) -> list[Passage]:
    rng = random.Random(seed)
    passages = []
    for i in range(n):
        name, p = PEOPLE[i % len(PEOPLE)]
        occ, city = rng.choice(OCCUPATIONS), rng.choice(CITIES)
        age, hobbies = rng.randint(19, 78), rng.sample(HOBBIES, rng.randint(1, 3))
        a_occ = ("an " if occ[0] in "aeiou" else "a ") + occ
        text = TEMPLATES[i % len(TEMPLATES)].format(
            name=name, age=age, occ=occ, a_occ=a_occ, city=city, p=p, P=p.capitalize(),
            pp="her" if p == "she" else "his", hobbies=english_list(hobbies))
        facts = {"name": name, "age": age, "city": city, "occupation": occ, "hobbies": hobbies}
        passages.append(Passage(text, facts))
    return passages


# --- results -----------------------------------------------------------------------------------
@dataclass
class Result:
    system: str
    mode: str
    texts: list[str]
    tokens: int  # generated tokens, EOS included
    seconds: float
    steps: int  # model forward passes
    compile_s: float
    token_ids: list[list[int]] = field(default_factory=list)
    prompt_ids: list[list[int]] = field(default_factory=list)
    valid: int = 0
    fields_right: int = 0

    @property
    def outputs_per_s(self) -> float:
        return len(self.texts) / self.seconds if self.seconds > 0 else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def tokens_per_step(self) -> float:
        return self.tokens / self.steps if self.steps else 0.0


def parse_json(text: str) -> Any:
    try:
        value = json.loads(text)
        jsonschema.validate(value, SCHEMA)
        return value
    except (ValueError, jsonschema.ValidationError):
        return None


def right_fields(value: Any, facts: dict[str, Any]) -> int:
    if not isinstance(value, dict):
        return 0
    norm = lambda v: v.strip().lower() if isinstance(v, str) else v  # noqa: E731
    right = sum(norm(value.get(k)) == norm(facts[k]) for k in ("name", "age", "city", "occupation"))
    hobbies = value.get("hobbies")
    if isinstance(hobbies, list) and sorted(map(norm, hobbies)) == sorted(facts["hobbies"]):
        right += 1
    return right


def score(result: Result, passages: list[Passage]) -> Result:
    for text, passage in zip(result.texts, passages):
        value = parse_json(text)
        result.valid += value is not None
        result.fields_right += right_fields(value, passage.facts)
    return result


# --- arguments ---------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--num-passages", type=int, default=None, help="default 32 (--quick: 8)")
    p.add_argument("--max-tokens", type=int, default=None, help="default 200 (--quick: 96)")
    p.add_argument("--max-total-tokens", type=int, default=16384, help="radixrt KV pool")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="few passages, small max_tokens")
    p.add_argument("--skip-outlines", action="store_true", help="run radixrt only")
    p.add_argument("--outlines-venv", default=None,
                   help=f"venv with outlines + transformers (default: {OUTLINES_VENV} if present)")
    p.add_argument("--install-outlines", action="store_true",
                   help=f"create {OUTLINES_VENV} and pip install outlines there (minutes)")
    p.add_argument("--outlines-batch-size", type=int, default=0,
                   help="prompts per outlines batch call; 0: all at once, 1: one at a time")
    p.add_argument("--no-flush-denormal", action="store_true",
                   help="leave denormal floats on (off by default in both processes: HF's CPU\n"
                        "matmuls can slow down many times over on denormals)")
    p.add_argument("--grammar-backend", default=DEFAULT_GRAMMAR_BACKEND, choices=GRAMMAR_BACKENDS,
                   help="radixrt's grammar engine (default %(default)s: llguidance for JSON\n"
                        "schemas)")
    p.add_argument("--outlines-whitespace", default="",
                   help="outlines' whitespace_pattern; default '' (compact JSON, as radixrt)")
    add_plot_dir(p)
    args = p.parse_args(argv)
    if args.num_passages is None:
        args.num_passages = 8 if args.quick else 32
    if args.max_tokens is None:
        args.max_tokens = 96 if args.quick else 200
    return args


# --- radixrt -----------------------------------------------------------------------------------
def chat_prompt(tokenizer: Any, passage: Passage) -> str:
    messages = [{"role": "user", "content": INSTRUCTION + passage.text}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def run_radixrt(engine: Any, name: str, prompts: list[str], max_tokens: int) -> Result:
    params = radixrt.SamplingParams(max_tokens=max_tokens, temperature=0.0, json_schema=SCHEMA)
    start = time.perf_counter()
    engine.grammars.compile_async(params.constraint).result()
    compile_s = time.perf_counter() - start
    engine.generate(prompts[:1], params.with_(max_tokens=4))  # warm-up
    engine.flush_cache()  # the timed run starts cold
    before = engine.stats()
    start = time.perf_counter()
    outs = engine.generate(prompts, params)
    seconds = time.perf_counter() - start
    after = engine.stats()
    steps = after["steps"] - before["steps"]
    tokens = after["generated_tokens"] - before["generated_tokens"]
    assert tokens == sum(len(o.token_ids) for o in outs), "generated_tokens != output lengths"
    mode = f"one batch, --grammar-backend {engine.config.grammar_backend}"
    return Result(name, mode, [o.text for o in outs], tokens, seconds, steps, compile_s,
                  [list(o.token_ids) for o in outs], [list(o.prompt_token_ids) for o in outs])


# --- outlines + HF, in its own venv ------------------------------------------------------------
def outlines_python(args: argparse.Namespace) -> str | None:
    """The venv's python if outlines and transformers import there, else None."""
    python = os.path.join(args.outlines_venv or OUTLINES_VENV, "bin", "python")
    if not os.path.isfile(python):
        return None
    probe = subprocess.run([python, "-c", "import outlines, transformers, gguf, jsonschema"],
                           capture_output=True)
    return python if probe.returncode == 0 else None


def install_outlines() -> float:
    """Create OUTLINES_VENV with outlines, on the project's torch and transformers versions.
    Returns the seconds it took."""
    print(f"creating {OUTLINES_VENV} and installing outlines (minutes) ...", flush=True)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "venv", OUTLINES_VENV], check=True)
    with open(os.path.join(OUTLINES_VENV, ".gitignore"), "w") as f:
        f.write("*\n")  # keep the venv out of git
    pins = [f"torch=={version('torch').split('+')[0]}",
            f"transformers=={version('transformers')}"]
    pip = os.path.join(OUTLINES_VENV, "bin", "pip")
    subprocess.run([pip, "install", *pins, *OUTLINES_PACKAGES], check=True)
    seconds = time.perf_counter() - start
    print(f"installed outlines into {OUTLINES_VENV} in {seconds:.0f} s", flush=True)
    return seconds


def run_outlines(python: str, args: argparse.Namespace, passages: list[Passage]) -> dict:
    folder, fname = default_model_path()
    request = {
        "model_folder": folder, "gguf_file": fname,
        "messages": [INSTRUCTION + p.text for p in passages], "schema": SCHEMA,
        "max_tokens": args.max_tokens, "batch_size": args.outlines_batch_size,
        "threads": torch.get_num_threads(), "whitespace_pattern": args.outlines_whitespace,
        "flush_denormal": not args.no_flush_denormal,
    }
    command = [python, PEER_SCRIPT]
    print(f"\n$ {shlex.join(command)}   (request on stdin)", flush=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    env.pop("PYTHONPATH", None)
    proc = subprocess.run(command, input=json.dumps(request), stdout=subprocess.PIPE,
                          text=True, env=env, timeout=PEER_TIMEOUT_S)
    if proc.returncode != 0:
        raise RuntimeError(f"the outlines peer failed (exit code {proc.returncode})")
    return json.loads(proc.stdout)


# --- reporting ---------------------------------------------------------------------------------
def pct(n: int, total: int) -> str:
    return f"{n / total:.0%}" if total else "-"


def first_divergence(a: list[int], b: list[int], tokenizer: Any) -> str:
    """Where two greedy outputs part: the shared text, then each one's next few tokens."""
    k = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    pieces = lambda ids: " ".join(repr(tokenizer.decode([t])) for t in ids[k : k + 4])  # noqa: E731
    return (f"after {tokenizer.decode(a[:k])!r} (token {k}): radixrt {pieces(a)} | "
            f"outlines {pieces(b)}")


def print_checks(results: dict[str, Result], peer: dict | None, tokenizer: Any) -> None:
    jf, no_jf = results[RT_JF], results[RT_NO_JF]
    same = sum(a == b for a, b in zip(jf.token_ids, no_jf.token_ids))
    flag = "" if same == len(jf.token_ids) else "   <-- WARNING: jump-forward changed outputs"
    print(f"radixrt with / without jump-forward: token-identical outputs "
          f"{same}/{len(jf.token_ids)}{flag}")
    if peer is not None:
        same_prompt = sum(a == b for a, b in zip(jf.prompt_ids, peer["prompt_ids"]))
        print(f"outlines+hf prompt token ids equal radixrt's: {same_prompt}/{len(jf.prompt_ids)}")
        out = results[OUTLINES]
        same_text = sum(a == b for a, b in zip(jf.texts, out.texts))
        same_ids = sum(a == b for a, b in zip(jf.token_ids, out.token_ids))
        print(f"outlines+hf output equals radixrt's: text {same_text}/{len(jf.texts)}, "
              f"token ids {same_ids}/{len(jf.texts)}")
        for i, (a, b) in enumerate(zip(jf.token_ids, out.token_ids)):
            if a != b:
                print(f"  first differing output, passage {i}: "
                      f"{first_divergence(a, b, tokenizer)}")
                break


def print_outputs(results: dict[str, Result], passages: list[Passage], shown: int = 3) -> None:
    print(f"\nfirst {min(shown, len(passages))} outputs:")
    for i, passage in enumerate(passages[:shown]):
        print(f"  passage: {passage.text}")
        for name in (RT_JF, OUTLINES):
            if name in results:
                print(f"    {name:<13} {results[name].texts[i]}")


def print_notes(results: dict[str, Result], args: argparse.Namespace,
                peer: dict | None, outlines_note: str | None) -> None:
    jf, no_jf = results[RT_JF], results[RT_NO_JF]
    print(f"\nradixrt jump-forward: {no_jf.steps / max(jf.steps, 1):.2f}x fewer model steps, "
          f"{jf.outputs_per_s / no_jf.outputs_per_s:.2f}x outputs/s")
    for name, r in results.items():
        print(f"{name}: grammar compile {r.compile_s:.2f} s (not in the timed run); {r.mode}")
    if OUTLINES in results:
        o = results[OUTLINES]
        print(f"radixrt-jf / outlines+hf: {jf.outputs_per_s / o.outputs_per_s:.2f}x outputs/s; "
              f"radixrt-no-jf / outlines+hf: {no_jf.outputs_per_s / o.outputs_per_s:.2f}x")
        versions = ", ".join(f"{k} {v}" for k, v in peer["versions"].items())  # type: ignore
        print(f"outlines+hf: {versions}; whitespace_pattern={args.outlines_whitespace!r}; "
              "steps = HF model forward calls (one per token position for the whole batch)")
    elif outlines_note:
        print(outlines_note)
    command = " ".join(shlex.quote(a) for a in [os.path.basename(sys.executable), *sys.argv])
    print(f"float32, CPU threads: {torch.get_num_threads()}, flush denormals: "
          f"{not args.no_flush_denormal}, {args.num_passages} passages, max_tokens "
          f"{args.max_tokens}; tok/step sums over the batch")
    print(f"command: {command}")


def print_summary(results: dict[str, Result]) -> None:
    jf = results[RT_JF]
    print("\n| system | mode | outputs | seconds | outputs/s | out tok/s | steps | tok/step | "
          "valid | fields right | radixrt-jf speed-up |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, r in results.items():
        n = len(r.texts)
        print(f"| {name} | {r.mode} | {n} | {r.seconds:.2f} | {r.outputs_per_s:.2f} | "
              f"{r.tokens_per_s:.1f} | {r.steps} | {r.tokens_per_step:.2f} | {pct(r.valid, n)} | "
              f"{pct(r.fields_right, 5 * n)} | {jf.outputs_per_s / r.outputs_per_s:.2f}x |")


# --- main --------------------------------------------------------------------------------------
def outlines_peer(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """(python of the outlines venv, None) or (None, a note saying why outlines is skipped)."""
    if args.skip_outlines:
        return None, "outlines+hf: skipped (--skip-outlines)"
    if args.install_outlines and outlines_python(args) is None:
        args.outlines_venv = OUTLINES_VENV
        install_outlines()
    python = outlines_python(args)
    if python is None:
        note = (f"outlines+hf: skipped (outlines is not importable from "
                f"{args.outlines_venv or OUTLINES_VENV}); enable it with --outlines-venv DIR "
                "or --install-outlines")
        print(note)
        return None, note
    return python, None


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if not args.no_flush_denormal:  # before torch starts its worker threads, which inherit it
        torch.set_flush_denormal(True)
    python, outlines_note = outlines_peer(args)
    passages = make_passages(args.num_passages, args.seed)
    loaded = load_model("default", dtype="float32", device="cpu")
    prompts = [chat_prompt(loaded.tokenizer, p) for p in passages]
    results: dict[str, Result] = {}
    for name, disable in ((RT_JF, False), (RT_NO_JF, True)):
        engine = radixrt.Engine(model=loaded, max_total_tokens=args.max_total_tokens,
                                disable_jump_forward=disable,
                                grammar_backend=args.grammar_backend)
        print(f"running {name} ...", flush=True)
        results[name] = score(run_radixrt(engine, name, prompts, args.max_tokens), passages)
        del engine
    peer = None
    if python is not None:
        peer = run_outlines(python, args, passages)
        results[OUTLINES] = score(Result(
            OUTLINES, peer["mode"], peer["texts"], sum(map(len, peer["token_ids"])),
            peer["seconds"], peer["forward_calls"], peer["compile_s"], peer["token_ids"]),
            passages)
    print()
    print_checks(results, peer, loaded.tokenizer)
    print_outputs(results, passages)
    print_notes(results, args, peer, outlines_note)
    print_summary(results)
    plot_summary(results, args.plot_dir)


def plot_summary(results: dict[str, Result], plot_dir: str | None) -> None:
    """Outputs/s and forward steps per system, with radixrt-jf's speed-up over each."""
    jf = results[RT_JF]
    names = list(results)
    caption = ", ".join(f"radixrt-jf {jf.outputs_per_s / r.outputs_per_s:.2f}x over {name}"
                        for name, r in results.items() if name != RT_JF)
    bar_panels(plot_path("json_decode", plot_dir), "JSON-schema decoding on the default model",
               ["all outputs"],
               [("outputs/s (higher is better)", {n: [results[n].outputs_per_s] for n in names}),
                ("forward steps (lower is better)", {n: [float(results[n].steps)]
                                                     for n in names})],
               caption)


if __name__ == "__main__":
    main()
