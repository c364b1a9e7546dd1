"""JSONSchemaBench's tables and plot (benchmarks/json_schema_bench.py runs the engines): per
engine and per folder, what compiled, what was refused and why, compile and mask times, walks
and invalid mutants; radixrt's chosen engine against the issue's bars; the plot."""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from typing import Any

from json_schema_docs import pct
from plots import bar_panels, plot_path

Results = dict[str, list[tuple[str, str, dict[str, Any]]]]  # engine -> (folder, file, result)
LABELS = {"outlines": "radixrt outlines-core", "llguidance": "radixrt llguidance (auto)",
          "llguidance-direct": "llguidance direct", "xgrammar": "XGrammar direct"}
CHOSEN = "llguidance"  # what --grammar-backend auto runs JSON schemas on
EXAMPLE_CHARS = 160  # of a document or a reason shown as an example


def reason_of(text: str) -> str:
    """The first words of a refusal's reason (after what the message says of the schema; its
    first line, without XGrammar's time and source line, with quoted names elided)."""
    for marker in (" cannot be compiled: ", " cannot enforce: ", " is invalid: "):
        if marker in text:
            text = text.split(marker, 1)[1]
            break
    text = (text.strip().splitlines() or [""])[0]
    text = re.sub(r"^(\w+: )?\[[\d:]+\] \S+:\d+: ", "", text)
    text = re.sub(r"'[^']*'", "'…'", text)
    return " ".join(text.split()[:8])[:72]


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    compiled = [r for r in rows if r["status"] == "compiled"]
    masks = [us for r in compiled for us in r.get("mask_us", ())]
    cpu = [us for r in compiled for us in r.get("mask_cpu_us", ())]
    compile_ms = [r["compile_ms"] for r in compiled]
    return {
        "schemas": len(rows),
        "compiled": len(compiled),
        "refused": sum(r["status"] == "refused" for r in rows),
        "timeout": sum(r["status"] == "timeout" for r in rows),
        "crashed": sum(r["status"] == "crashed" for r in rows),
        "walks_stopped": sum(bool(r.get("walks_stopped")) for r in compiled),
        "walk_errors": sum(bool(r.get("walk_error")) for r in compiled),
        "compile_p50": pct(compile_ms, 0.5), "compile_p95": pct(compile_ms, 0.95),
        "compile_max": max(compile_ms, default=float("nan")),
        "mask_p50": pct(masks, 0.5), "mask_p99": pct(masks, 0.99),
        "cpu_p50": pct(cpu, 0.5), "cpu_p99": pct(cpu, 0.99), "masks": len(masks),
        **{key: sum(r.get(key, 0) for r in compiled)
           for key in ("finished", "valid", "unjudged", "controls", "controls_accepted",
                       "mutants", "untokenizable")},
        "accepted": sum(len(r.get("accepted", ())) for r in compiled),
    }


def ms(value: float) -> str:
    return "–" if value != value else f"{value:.1f}" if value < 100 else f"{value:,.0f}"


def us(value: float) -> str:
    return "–" if value != value else f"{value:.0f}"


def report(results: Results, total: int, timeout: float) -> None:
    sums = {e: summary([r for _, _, r in rows]) for e, rows in results.items()}
    print(f"\n| engine | compiled | refused | past {timeout:.0f} s | compile p50 / p95 / max ms "
          "| finished walks valid | mask per token p50 / p99 µs (CPU) | mask p50 / p99 µs (wall) "
          "| invalid mutants accepted | valid docs re-fed accepted |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for engine, s in sums.items():
        print(f"| {LABELS[engine]} | {s['compiled']}/{total} | {s['refused']} | {s['timeout']} | "
              f"{ms(s['compile_p50'])} / {ms(s['compile_p95'])} / {ms(s['compile_max'])} | "
              f"{s['valid']}/{s['finished']} | {us(s['cpu_p50'])} / {us(s['cpu_p99'])} | "
              f"{us(s['mask_p50'])} / {us(s['mask_p99'])} | "
              f"{s['accepted']}/{s['mutants']} | {s['controls_accepted']}/{s['controls']} |")
    print(f"\n| folder | engine | compiled | refused | past {timeout:.0f} s | compile p50 / p95 ms "
          "| walks valid | mask p50 / p99 µs (CPU) | invalid accepted |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    folders = sorted({f for rows in results.values() for f, _, _ in rows})
    for folder in folders:
        for engine, rows in results.items():
            s = summary([r for f, _, r in rows if f == folder])
            print(f"| {folder} | {engine} | {s['compiled']}/{s['schemas']} | {s['refused']} | "
                  f"{s['timeout']} | {ms(s['compile_p50'])} / {ms(s['compile_p95'])} | "
                  f"{s['valid']}/{s['finished']} | {us(s['cpu_p50'])} / {us(s['cpu_p99'])} | "
                  f"{s['accepted']}/{s['mutants']} |")
    chosen = sums.get(CHOSEN)
    peers = [e for e in ("llguidance-direct", "xgrammar", "outlines") if e in sums]
    if chosen is not None and peers:
        print("\ncoverage, radixrt auto (llguidance) vs " + ", ".join(
            f"{LABELS[e]}: {chosen['compiled']}/{sums[e]['compiled']} = "
            f"{chosen['compiled'] / max(sums[e]['compiled'], 1):.2f}x" for e in peers))
    if chosen is not None:
        s = chosen
        walks_ok = s["valid"] == s["finished"]
        checks = [
            (f"coverage {s['compiled']}/{total} = {100 * s['compiled'] / total:.1f}% (>= 84%)",
             s["compiled"] >= 0.84 * total),
            (f"invalid mutants accepted {s['accepted']} (0)", s["accepted"] == 0),
            (f"compiles past {timeout:.0f} s: {s['timeout']} (0)", s["timeout"] == 0),
            (f"finished walks valid {s['valid']}/{s['finished']} (all)", walks_ok),
            (f"mask p99 {us(s['cpu_p99'])} µs CPU, {us(s['mask_p99'])} µs wall (<= 1000)",
             s["cpu_p99"] <= 1000),
        ]
        print("\nradixrt's chosen engine: " + "; ".join(
            f"{text} {'ok' if ok else 'MISSED'}" for text, ok in checks))
    for engine, rows in results.items():
        s = sums[engine]
        reasons = Counter(reason_of(r["reason"]) for _, _, r in rows if r["status"] == "refused")
        print(f"\n{LABELS[engine]}: {s['refused']} refused, {s['timeout']} past the limit, "
              f"{s['crashed']} crashed (or past 8 GiB), {s['walks_stopped']} walks stopped "
              f"(--walk-timeout or crashed), {s['walk_errors']} walks failed, "
              f"{s['unjudged']} walks jsonschema "
              f"could not judge, {s['untokenizable']} mutants the tokenizer does not spell back")
        for reason, count in reasons.most_common():
            print(f"  {count:>3}  {reason}")
        for f, n, r in rows:
            if r.get("walk_error") or r.get("walks_stopped"):
                print(f"  walks {r.get('walks_stopped') or 'failed'}  {f}/{n}: "
                      f"{r.get('walk_error', '')[:EXAMPLE_CHARS]}")
        bad = [(f"{f}/{n}", w) for f, n, r in rows for w in r.get("invalid_walks", ())]
        for where, text in bad[:6]:
            print(f"  invalid walk  {where}: {text}")
        accepted = [(f"{f}/{n}", k, t) for f, n, r in rows for k, t in r.get("accepted", ())]
        kinds = Counter(k for _, k, _ in accepted)
        if accepted:
            print(f"  invalid mutants accepted, by kind: {dict(kinds.most_common())}")
        for where, kind, text in accepted[:8]:
            print(f"  accepted ({kind})  {where}: {text}")
    if CHOSEN in results and "llguidance-direct" in results:
        direct = {(f, n): r for f, n, r in results["llguidance-direct"]}
        only = [(f, n, r) for f, n, r in results[CHOSEN]
                if r["status"] != "compiled" and direct[(f, n)]["status"] == "compiled"]
        print(f"\nradixrt's llguidance refuses, llguidance direct compiles: {len(only)}")
        for f, n, r in only[:12]:
            print(f"  {f}/{n}: {reason_of(r.get('reason', r['status']))}")


SHORT = {"Github_easy": "GH\neasy", "Github_hard": "GH\nhard", "Github_medium": "GH\nmedium",
         "Github_trivial": "GH\ntrivial", "Github_ultra": "GH\nultra", "Glaiveai2K": "Glaive",
         "JsonSchemaStore": "Schema\nStore", "Kubernetes": "K8s", "Snowplow": "Snow-\nplow",
         "WashingtonPost": "Wash.\nPost"}


def plot(results: Results, plot_dir: str | None) -> None:
    folders = sorted({f for rows in results.values() for f, _, _ in rows})
    compiled: dict[str, list[float]] = defaultdict(list)
    invalid: dict[str, list[float]] = defaultdict(list)
    for engine, rows in results.items():
        for folder in folders:
            s = summary([r for f, _, r in rows if f == folder])
            compiled[LABELS[engine]].append(100.0 * s["compiled"] / max(s["schemas"], 1))
            bad = s["finished"] - s["valid"] - s["unjudged"] + s["accepted"]
            invalid[LABELS[engine]].append(100.0 * bad / max(s["finished"] + s["mutants"], 1))
    sums = {e: summary([r for _, _, r in rows]) for e, rows in results.items()}
    bar_panels(plot_path("json_schema_bench", plot_dir),
               "JSONSchemaBench: radixrt's engines, llguidance and XGrammar (no model)",
               [SHORT.get(f, f[:8]) for f in folders],
               [("schemas compiled, % (higher is better)", dict(compiled)),
                ("invalid docs let through, % (lower is better)",
                 dict(invalid))],
               " · ".join(f"{LABELS[e]}: compile p50 {ms(s['compile_p50'])} ms, mask p50 / p99 "
                          f"{us(s['cpu_p50'])} / {us(s['cpu_p99'])} µs CPU"
                          for e, s in sums.items()))
