"""Program benchmarks: DSL programs in the shape of the SGLang paper's workloads, run on three
systems in one go, measured as programs/s and prefix-cache hit rate.

Workloads (benchmarks/programs_workloads.py): few-shot (an MMLU-style ~1,100-token few-shot
prefix shared by every program, then a `select` of A-D), tree-of-thought (fork 2 x 2 with short
gens, then a select), llm-judge (an article, fork 3 aspects with gen(stop="\\n"), join, select a
verdict) and multi-turn-chat (4 user/assistant turns on a shared system prompt).

Systems, each warmed up with one tiny program before it is timed:
  radixrt           `rx.Runtime()` (radix cache on), run_batch with --threads programs at a time
  radixrt-no-cache  `rx.Runtime(disable_radix_cache=True)`, the same calls
  llama.cpp         its C++ llama-server on the same GGUF file through rx.OpenAICompatible (select
                    scored from next-token logprobs: llama-server does not echo prompt logprobs),
                    on the --llama-workloads only (default few-shot), run_batch as radixrt's
  hf                the same @rx.function programs on a plain transformers backend: gen is
                    model.generate (greedy, batch size 1, stop strings checked on the decoded
                    text), select is one forward pass per choice over text + choice (mean token
                    log-probability, as radixrt's default), fork children run one after another,
                    one program at a time, nothing reused between calls
Greedy everywhere; gens not ended by a stop string use ignore_eos, so every system writes the
same number of tokens. Hit rate = cached / prompt tokens from the runtime's info() counters
(before/after each workload; run_batch's prefix pin and select's prefill count as prompts).

    python benchmarks/programs.py                  # all workloads, 16 programs each (long on CPU)
    python benchmarks/programs.py --quick          # tiny sizes, ~3-4 minutes on 2 cores
    python benchmarks/programs.py --quick --torch-threads 1   # the same on a busy shared machine
    python benchmarks/programs.py --workloads few-shot --num-programs 64 --hf-num-programs 8
    python benchmarks/programs.py --asyncio        # few-shot at 64 and 512 programs: threads
                                                   # (run_batch) vs asyncio (arun_batch)
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from offline_throughput import load_hf  # noqa: E402
from plots import add_plot_dir, bar_panels, plot_path  # noqa: E402
from programs_asyncio import run_asyncio_study  # noqa: E402
from programs_workloads import WORKLOADS, Sizes, Workload, build_workloads  # noqa: E402
from programs_workloads import warm_up_program as warm_up  # noqa: E402
from serving_systems import (  # noqa: E402
    LLAMA_SERVER,
    LLAMA_SERVER_SLOTS,
    llama_server_system,
    running,
)
from transformers import StoppingCriteria, StoppingCriteriaList  # noqa: E402

import radixrt as rx  # noqa: E402
from radixrt.frontend.lang.backend import (  # noqa: E402
    BackendError,
    ChatFormat,
    ChoiceLogprobs,
    GenResult,
    constraint_of,
)
from radixrt.runtime.models.loader import load_tokenizer  # noqa: E402
from radixrt.runtime.sampling_params import SamplingParams  # noqa: E402
from radixrt.runtime.server.dsl.dsl_scoring import common_len  # noqa: E402
from radixrt.runtime.tokenizer.chat_roles import chat_roles  # noqa: E402

SYSTEMS = ("radixrt", "radixrt-no-cache", "hf")
COUNTERS = ("prompt_tokens", "cached_tokens", "computed_tokens")


@dataclass
class Result:
    system: str
    programs: int
    seconds: float
    prompt_tokens: int
    cached_tokens: int
    computed_tokens: int  # tokens through the model (prefill + decode)
    outcomes: list[Any]  # each program's workload.outcome, to compare systems

    @property
    def per_s(self) -> float:
        return self.programs / self.seconds if self.seconds > 0 else 0.0

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


# --- arguments ---------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    p.add_argument("--num-programs", type=int, default=16, help="programs per workload")
    p.add_argument("--hf-num-programs", type=int, default=None,
                   help="HF runs only the first this many (default: all); programs/s compares")
    p.add_argument("--threads", type=int, default=16, help="radixrt run_batch num_threads")
    p.add_argument("--shots", type=int, default=Sizes.shots, help="few-shot examples (at most 30)")
    p.add_argument("--max-total-tokens", type=int, default=16384, help="radixrt KV pool")
    p.add_argument("--torch-threads", type=int, default=None,
                   help="CPU threads of every system (torch.set_num_threads here, OMP_NUM_THREADS "
                   "for the runtimes); default: torch's. 1 helps on a busy shared machine")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="tiny sizes (a smoke test)")
    p.add_argument("--skip-hf", action="store_true", help="leave HF transformers out")
    p.add_argument("--skip-llama-cpp", action="store_true", help="leave llama.cpp out")
    p.add_argument("--llama-server", default=None,
                   help="llama-server binary (default: ../shared/llama-server/ if it is there)")
    p.add_argument("--llama-workloads", nargs="+", choices=WORKLOADS, default=["few-shot"],
                   help="the workloads llama.cpp runs")
    p.add_argument("--asyncio", action="store_true",
                   help="instead: the few-shot workload with threads vs asyncio "
                   "(programs_asyncio.py)")
    add_plot_dir(p)
    args = p.parse_args(argv)
    args.sizes = Sizes(shots=args.shots)
    if args.quick:
        args.num_programs, args.threads = min(args.num_programs, 3), min(args.threads, 4)
        args.sizes = Sizes(shots=min(args.shots, 6), tot_tokens=4, judge_tokens=8,
                           chat_turns=2, chat_tokens=8)
        args.max_total_tokens = min(args.max_total_tokens, 8192)
    args.hf_num_programs = min(args.hf_num_programs or args.num_programs, args.num_programs)
    return args


# --- radixrt -----------------------------------------------------------------------------------
def run_radixrt(name: str, works: list[Workload], args: argparse.Namespace,
                **config: Any) -> list[Result]:
    start = time.perf_counter()
    with rx.Runtime(max_total_tokens=args.max_total_tokens, log_level="warning", **config) as rt:
        print(f"[{name}] runtime started in {time.perf_counter() - start:.1f}s", flush=True)
        warm_up.run(backend=rt)
        results = []
        for work in works:
            before = rt.info()
            t0 = time.perf_counter()
            states = work.program.run_batch(work.inputs, backend=rt, num_threads=args.threads)
            seconds = time.perf_counter() - t0
            after = rt.info()
            delta = {k: int(after[k]) - int(before[k]) for k in COUNTERS}
            results.append(Result(name, len(states), seconds, **delta,
                                  outcomes=[work.outcome(st) for st in states]))
            report_progress(work, results[-1])
    return results


def report_progress(work: Workload, r: Result) -> None:
    print(f"[{r.system}] {work.name}: {r.programs} programs in {r.seconds:.2f}s "
          f"({r.per_s:.2f}/s), hit rate {r.hit_rate:.0%}", flush=True)


# --- Hugging Face, no sharing --------------------------------------------------------------------
class StopStrings(StoppingCriteria):
    """Stop once the decoded new text contains a stop string (as radixrt's detokenizer does)."""

    def __init__(self, tokenizer: Any, start: int, stops: tuple[str, ...]) -> None:
        self.tokenizer, self.start, self.stops = tokenizer, start, stops

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **_: Any) -> torch.Tensor:
        text = self.tokenizer.decode(input_ids[0, self.start :], skip_special_tokens=True)
        done = any(s in text for s in self.stops)
        return torch.full((input_ids.shape[0],), done, dtype=torch.bool)


class HFBackend:
    """The DSL's primitives done the plain way on transformers: one model call at a time (a lock
    serialises fork children), batch size 1, every call recomputes its whole text."""

    def __init__(self, model: Any, tokenizer: Any) -> None:
        self.model, self.tokenizer = model, tokenizer
        self._chat = ChatFormat.from_info(chat_roles(tokenizer))
        self._eos = int(tokenizer.eos_token_id)
        self._lock = threading.Lock()
        self.counters = dict.fromkeys(COUNTERS, 0)

    def chat_format(self) -> ChatFormat:
        return self._chat

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=True))

    @torch.inference_mode()
    def generate(self, text: str, params: dict[str, Any],
                 on_piece: Callable[[str], None] | None, priority: int = 0) -> GenResult:
        if constraint_of(params) is not None:
            raise BackendError("the HF baseline has no constrained decoding")
        p = SamplingParams(**params)
        if p.temperature != 0:
            raise BackendError("the HF baseline is greedy only (temperature=0)")
        ids = self._encode(text)
        max_tokens = p.resolved_max_tokens(len(ids), self.model.config.max_position_embeddings)
        stops = StoppingCriteriaList([StopStrings(self.tokenizer, len(ids), p.stop)])
        prompt = torch.tensor([ids])  # [1, len]
        with self._lock:
            out = self.model.generate(
                input_ids=prompt, attention_mask=torch.ones_like(prompt),
                max_new_tokens=max_tokens, min_new_tokens=max_tokens if p.ignore_eos else 0,
                do_sample=False, eos_token_id=self._eos, pad_token_id=self._eos,
                stopping_criteria=stops if p.stop else None,
            )  # [1, len(ids) + new]
        new = out[0, len(ids) :].tolist()
        result = self.tokenizer.decode(new, skip_special_tokens=True)
        reason = "stop" if not p.ignore_eos and new and new[-1] == self._eos else "length"
        cuts = [result.find(s) for s in p.stop if s in result]
        if cuts:
            result, reason = result[: min(cuts)], "stop"
        self._count(len(ids), len(ids) + len(new))
        return GenResult(result, reason, len(ids), 0, len(new))

    @torch.inference_mode()
    def score(self, text: str, choices: list[str], unconditional: bool,
              priority: int = 0) -> list[ChoiceLogprobs]:
        if unconditional:
            raise BackendError("the HF baseline scores conditional log-probabilities only")
        prefix = self._encode(text)
        fulls = [self._encode(text + c) for c in choices]
        # the first scored token: where the choices' tokenizations leave the text's (as radixrt)
        start = max(1, min(min(common_len(prefix, f), len(f) - 1) for f in fulls))
        out = []
        for ids in fulls:  # one forward pass per choice over the whole text + choice
            with self._lock:
                logits = self.model(input_ids=torch.tensor([ids])).logits[0]  # [len, vocab]
            logp = torch.log_softmax(logits[start - 1 : -1].float(), dim=-1)
            target = torch.tensor(ids[start:]).unsqueeze(1)
            out.append(ChoiceLogprobs(logp.gather(1, target).squeeze(1).tolist()))
            self._count(len(ids), len(ids))
        return out

    def _count(self, prompt: int, computed: int) -> None:
        with self._lock:
            self.counters["prompt_tokens"] += prompt
            self.counters["computed_tokens"] += computed

    def pin(self, text: str, priority: int = 0) -> None:
        return None  # nothing is kept between calls (one request at a time: no priority)

    def unpin(self, handle: Any) -> None:
        pass

    def info(self) -> dict[str, Any]:
        return dict(self.counters)


def run_llama_cpp(works: list[Workload], args: argparse.Namespace) -> list[Result | None]:
    """The --llama-workloads on llama-server (None for the others, or for all without it)."""
    binary = args.llama_server or (LLAMA_SERVER if os.access(LLAMA_SERVER, os.X_OK) else None)
    if binary is None:
        print("[llama.cpp] skipped: no llama-server (--llama-server PATH)", flush=True)
        return [None] * len(works)
    results: list[Result | None] = []
    # each of its slots holds a few-shot program's ~1,200-token prompt: 2,048 tokens a slot
    with running(llama_server_system(binary, context=LLAMA_SERVER_SLOTS * 2048)) as base:
        backend = rx.OpenAICompatible(base + "/v1", "default", chat_format="chatml")
        warm_up.run(backend=backend)
        for work in works:
            if work.name not in args.llama_workloads:
                results.append(None)
                continue
            t0 = time.perf_counter()
            states = work.program.run_batch(work.inputs, backend=backend,
                                            num_threads=args.threads)
            results.append(Result("llama.cpp", len(states), time.perf_counter() - t0, 0, 0, 0,
                                  outcomes=[work.outcome(st) for st in states]))
            report_progress(work, results[-1])
    return results


def run_hf(works: list[Workload], args: argparse.Namespace) -> list[Result]:
    start = time.perf_counter()
    backend = HFBackend(load_hf(), load_tokenizer("default"))
    print(f"[hf] model loaded in {time.perf_counter() - start:.1f}s", flush=True)
    warm_up.run(backend=backend)
    results = []
    for work in works:
        inputs = work.inputs[: args.hf_num_programs]
        before = backend.info()
        t0 = time.perf_counter()
        states = work.program.run_batch(inputs, backend=backend, num_threads=1)  # one at a time
        seconds = time.perf_counter() - t0
        delta = {k: backend.counters[k] - before[k] for k in COUNTERS}
        results.append(Result("hf", len(states), seconds, **delta,
                              outcomes=[work.outcome(st) for st in states]))
        report_progress(work, results[-1])
    return results


# --- reporting ---------------------------------------------------------------------------------
def ratio(a: Result | None, b: Result | None) -> str:
    if a is None or b is None or b.per_s <= 0:
        return "-"
    return f"{a.per_s / b.per_s:.2f}x"


def agreement(ref: Result, other: Result) -> str:
    n = min(len(ref.outcomes), len(other.outcomes))
    same = sum(x == y for x, y in zip(ref.outcomes, other.outcomes))
    return f"{same}/{n}"


def print_workload(work: Workload, results: dict[str, Result]) -> None:
    print(f"\n== {work.name}: {work.describe} ==")
    head = (f"{'system':<17} {'programs':>8} {'seconds':>9} {'programs/s':>10} "
            f"{'cache hit':>9} {'computed tok':>12} {'same as radixrt':>15}")
    print(head)
    print("-" * len(head))
    ref = results["radixrt"]
    for r in results.values():
        print(f"{r.system:<17} {r.programs:>8} {r.seconds:>9.2f} {r.per_s:>10.2f} "
              f"{r.hit_rate:>9.1%} {r.computed_tokens:>12} {agreement(ref, r):>15}")
    over = [f"{ratio(ref, results[name])} over {label}"
            for name, label in (("radixrt-no-cache", "no-cache"), ("llama.cpp", "llama.cpp"),
                                ("hf", "HF")) if name in results]
    print("radixrt speed-up: " + ", ".join(over))


def print_summary(rows: list[tuple[Workload, dict[str, Result]]], args: argparse.Namespace,
                  seconds: float) -> None:
    print("\n| workload | programs | radixrt prog/s | cache hit | no-cache prog/s "
          "| llama.cpp prog/s (same picks) | HF prog/s | vs no-cache | vs llama.cpp | vs HF |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for work, res in rows:
        rt, nc, hf = res["radixrt"], res.get("radixrt-no-cache"), res.get("hf")
        cpp = res.get("llama.cpp")
        programs = f"{rt.programs}" + (f" (HF {hf.programs})" if hf and hf.programs != rt.programs
                                       else "")
        cpp_cell = f"{cpp.per_s:.2f} ({agreement(rt, cpp)})" if cpp else "-"
        print(f"| {work.name} | {programs} | {rt.per_s:.2f} | {rt.hit_rate:.0%} | "
              f"{nc.per_s if nc else 0:.2f} | {cpp_cell} | {f'{hf.per_s:.2f}' if hf else '-'} | "
              f"{ratio(rt, nc)} | {ratio(rt, cpp)} | {ratio(rt, hf)} |")
    sizes = ", ".join(f"{k}={v}" for k, v in dataclasses.asdict(args.sizes).items())
    print(f"\nfloat32 on CPU ({os.cpu_count()} cores, torch threads {torch.get_num_threads()}); "
          f"radixrt run_batch threads {args.threads}, HF one program at a time; {sizes}")
    command = " ".join(shlex.quote(a) for a in [os.path.basename(sys.executable), *sys.argv])
    print(f"command: {command}  (took {seconds:.0f}s in all)")


# --- main --------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    # denormal floats slow HF's forward pass on the CPU by 15-30x (radixrt's not): flush them
    # to zero before torch starts its threads, for every system alike
    torch.set_flush_denormal(True)
    if args.torch_threads is not None:
        os.environ["OMP_NUM_THREADS"] = str(args.torch_threads)  # the runtimes inherit it
        torch.set_num_threads(args.torch_threads)
    if args.asyncio:
        run_asyncio_study(args)
        return
    start = time.perf_counter()
    works = build_workloads(args.workloads, args.num_programs, args.sizes, args.seed)
    by_system = {
        "radixrt": run_radixrt("radixrt", works, args),
        "radixrt-no-cache": run_radixrt("radixrt-no-cache", works, args,
                                        disable_radix_cache=True),
    }
    if not args.skip_llama_cpp:
        by_system["llama.cpp"] = run_llama_cpp(works, args)
    if not args.skip_hf:
        by_system["hf"] = run_hf(works, args)
    rows = [(work, {name: res[i] for name, res in by_system.items() if res[i] is not None})
            for i, work in enumerate(works)]
    for work, results in rows:
        print_workload(work, results)
    print_summary(rows, args, time.perf_counter() - start)
    plot_summary(rows, args)


def plot_summary(rows: list[tuple[Workload, dict[str, Result]]], args: argparse.Namespace) -> None:
    """Programs/s of every system on every workload, with radixrt's speed-up over HF."""
    names = list(dict.fromkeys(name for _, res in rows for name in res))
    series = {name: [res[name].per_s if name in res else 0.0 for _, res in rows]
              for name in names}
    speedups = ", ".join(f"{work.name} {ratio(res['radixrt'], res['hf'])}"
                         for work, res in rows if "hf" in res)
    bar_panels(plot_path("programs", args.plot_dir), "DSL programs/s (higher is better)",
               [work.name for work, _ in rows], [("programs/s", series)],
               f"{args.num_programs} programs per workload; radixrt vs HF: {speedups}"
               if speedups else f"{args.num_programs} programs per workload")

if __name__ == "__main__":
    main()
