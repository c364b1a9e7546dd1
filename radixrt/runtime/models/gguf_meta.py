"""A GGUF's metadata as llama.cpp reads it: keys under the architecture's prefix
("gemma2.block_count", "qwen2moe.expert_count", ...), counts that may be per-layer arrays, and
llama.cpp's pattern of sliding-window layers. Shared by the dense architectures' readers
(models/gguf_archs.py) and the mixture-of-experts ones (models/gguf_moe.py)."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

SLIDING, FULL = "sliding_attention", "full_attention"


class ArchMeta:
    """A GGUF's metadata read under its architecture's prefix ("gemma2.block_count" ...), and
    the names of its tensors (some traits are told by which tensors a file has)."""

    def __init__(self, meta: Mapping[str, Any], arch: str,
                 tensors: Collection[str] = ()) -> None:
        self.meta = meta
        self.arch = arch
        self.tensors = tensors

    def has_tensor(self, suffix: str) -> bool:
        """Whether some tensor's name ends with suffix (".exp_probs_b.bias": on any layer)."""
        return any(name.endswith(suffix) for name in self.tensors)

    def get(self, key: str, default: Any = None) -> Any:
        return self.meta.get(f"{self.arch}.{key}", default)

    def integer(self, key: str, default: int | None = None) -> int:
        """A count; a per-layer array is accepted only when all layers agree."""
        value = self.get(key, default)
        if value is None:
            raise ValueError(f"the GGUF lacks {self.arch}.{key}")
        if isinstance(value, tuple) or not isinstance(value, (int, float)):
            values = set(value) if isinstance(value, tuple) else {None}
            if len(values) != 1 or None in values:
                raise ValueError(f"the GGUF's {self.arch}.{key} differs between layers "
                                 f"({value!r}): not supported")
            value = values.pop()
        return int(value)

    def number(self, key: str, default: float | None = None) -> float:
        value = self.get(key, default)
        if value is None:
            raise ValueError(f"the GGUF lacks {self.arch}.{key}")
        return float(value)


def sliding_layers(num_layers: int, pattern: int | tuple[Any, ...]) -> list[str]:
    """llama.cpp's set_swa_pattern(n): layer i slides unless i % n == n - 1 (an explicit
    per-layer array of booleans, when the file has one, says it directly)."""
    if isinstance(pattern, tuple):
        if len(pattern) != num_layers:
            raise ValueError(f"sliding_window_pattern has {len(pattern)} entries for "
                             f"{num_layers} layers")
        return [SLIDING if slides else FULL for slides in pattern]
    return [SLIDING if i % pattern < pattern - 1 else FULL for i in range(num_layers)]
