"""JSON schema -> regex, with numeric bounds enforced.

outlines-core turns a schema into a regex but ignores minimum / maximum on integers and numbers.
Each bounded numeric node is swapped for a sentinel constant, the schema is converted, and each
sentinel is replaced by a regex for exactly the integers (or decimals) within the bounds.
"""

from __future__ import annotations

import json
import math
from typing import Any

from outlines_core.json_schema import build_regex_from_schema

_BOUND_KEYS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
FRACTION = r"(\.[0-9]{1,6})?"


def schema_to_regex(schema_text: str, whitespace: str) -> str:
    schema = json.loads(schema_text)
    sentinels: dict[str, str] = {}
    swapped = _swap(schema, sentinels)
    regex = build_regex_from_schema(json.dumps(swapped), whitespace)
    for sentinel, number_regex in sentinels.items():
        regex = regex.replace(f'"{sentinel}"', f"({number_regex})")
    return regex


def _swap(node: Any, sentinels: dict[str, str]) -> Any:
    if isinstance(node, list):
        return [_swap(item, sentinels) for item in node]
    if not isinstance(node, dict):
        return node
    kind = node.get("type")
    if kind in ("integer", "number") and any(k in node for k in _BOUND_KEYS):
        lo, hi = _bounds(node, integer=kind == "integer")
        sentinel = f"RXBOUNDED{len(sentinels)}"
        sentinels[sentinel] = integer_regex(lo, hi) if kind == "integer" else number_regex(lo, hi)
        return {"const": sentinel}
    return {key: _swap(value, sentinels) for key, value in node.items()}


def _bounds(node: dict[str, Any], integer: bool) -> tuple[float | None, float | None]:
    for key in _BOUND_KEYS:
        value = node.get(key)
        if value is not None and (not isinstance(value, (int, float)) or isinstance(value, bool)
                                  or not math.isfinite(value)):
            raise ValueError(f"json_schema is invalid: {key} must be a finite number, got "
                             f"{value!r}")
    lo = node.get("minimum")
    hi = node.get("maximum")
    if "exclusiveMinimum" in node:  # draft 6+: a number (rounded in by one integer step)
        lo = math.floor(node["exclusiveMinimum"]) + 1
    if "exclusiveMaximum" in node:
        hi = math.ceil(node["exclusiveMaximum"]) - 1
    if lo is not None and hi is not None and lo > hi:
        raise ValueError(f"json_schema is invalid: minimum {lo} > maximum {hi}")
    return lo, hi


def integer_regex(lo: float | None, hi: float | None) -> str:
    """JSON integers n with lo <= n <= hi (None: unbounded on that side)."""
    lo_i = None if lo is None else math.ceil(lo)
    hi_i = None if hi is None else math.floor(hi)
    if lo_i is not None and hi_i is not None and lo_i > hi_i:
        raise ValueError(f"json_schema is invalid: no integer in [{lo}, {hi}]")
    parts = []
    if lo_i is None or lo_i < 0:  # negative side: -(|n|) for n in [lo, min(hi, -1)]
        abs_lo = 1 if hi_i is None or hi_i >= 0 else -hi_i
        abs_hi = None if lo_i is None else -lo_i
        parts.append(f"-({_nonneg(abs_lo, abs_hi)})")
    if hi_i is None or hi_i >= 0:
        parts.append(_nonneg(max(lo_i or 0, 0), hi_i))
    return "|".join(f"({p})" for p in parts)


def number_regex(lo: float | None, hi: float | None) -> str:
    """JSON numbers within [lo, hi]: integers in range, and decimals (up to 6 places) where the
    whole unit interval [k, k + 1) of a non-negative integer part k fits."""
    whole = integer_regex(lo, hi)
    frac_lo = max(0, math.ceil(lo)) if lo is not None else 0
    frac_hi = None if hi is None else math.floor(hi) - 1
    if frac_hi is not None and frac_hi < frac_lo:
        return whole
    return f"({whole})|({_nonneg(frac_lo, frac_hi)}){FRACTION}"


def _nonneg(lo: int, hi: int | None) -> str:
    """Non-negative integers lo..hi without leading zeros (hi None: no upper bound)."""
    parts = []
    top_len = len(str(hi)) if hi is not None else len(str(lo))
    for length in range(len(str(lo)), top_len + 1):
        first = lo if length == len(str(lo)) else 10 ** (length - 1)
        last = hi if hi is not None and length == top_len else 10**length - 1
        if first <= last:
            parts.append(_same_length(str(first), str(last)))
    if hi is None:
        parts.append(f"[1-9][0-9]{{{len(str(lo))},}}")
    return "|".join(parts)


def _same_length(lo: str, hi: str) -> str:
    """Digit strings of one length from lo to hi (inclusive)."""
    if not lo:
        return ""
    if lo == hi:
        return lo
    if set(lo) == {"0"} and set(hi) == {"9"}:
        return f"[0-9]{{{len(lo)}}}"
    if lo[0] == hi[0]:
        return lo[0] + _same_length(lo[1:], hi[1:])
    rest = len(lo) - 1
    parts = [lo[0] + _same_length(lo[1:], "9" * rest)]
    if int(hi[0]) - int(lo[0]) > 1:
        parts.append(f"[{int(lo[0]) + 1}-{int(hi[0]) - 1}]" + (f"[0-9]{{{rest}}}" if rest else ""))
    parts.append(hi[0] + _same_length("0" * rest, hi[1:]))
    return "(" + "|".join(parts) + ")"
