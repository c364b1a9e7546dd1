"""SGLang's `sgl.global_config`: the DSL's process-wide settings, as one object.

`default_backend` is the backend `set_default_backend` set (read and written live: it is
api.DEFAULT_BACKEND's, the one place it is held). The other settings are SGLang's, with its
defaults, each wired to what radixrt does where it means something:

- `verbosity`: 2 or more prints each finished program's text (`run`, a direct call, each
  program of `run_batch`, `arun`), as SGLang does; below 2, nothing.
- `skip_special_tokens_in_output`: the `skip_special_tokens` of every gen whose own options (and
  whose run's) do not set it: False keeps special tokens (`<|im_end|>`, ...) in the output text.
  Read at each gen, as SGLang reads it at each call.
- `enable_precache_with_tracing`: the default of `run_batch` / `arun_batch`'s `prefix_cache`:
  trace the program, compute its constant prefix once and keep it cached for the batch.
- `spaces_between_special_tokens_in_out`: no effect, accepted as a bool. SGLang passes it to
  the tokenizer's decode, where only slow (Python) tokenizers use it; radixrt decodes with the
  model's fast (Rust `tokenizers`) tokenizer, which has no such option, so there is nothing to
  set.
- `enable_parallel_encoding`: no effect, accepted as a bool. In SGLang it makes
  `join(mode="concate_and_append")` splice the forks' KV caches together (its runtime's
  /concate_and_append_request) instead of appending their text; radixrt always appends the
  text, exactly (the shared prefix is a radix cache hit, the children's text is computed after
  it, as their positions require), so both values behave the same.

Settings are checked when set (a bool, an int >= 0 for verbosity), and a name that is not a
setting is an AttributeError: nothing is accepted and ignored silently. The object guards its
values with a lock, as api.DEFAULT_BACKEND does its backend.
"""

from __future__ import annotations

import threading
from typing import Any

from radixrt.frontend.lang.api import DEFAULT_BACKEND

# setting -> SGLang's default
DEFAULTS: dict[str, Any] = {
    "verbosity": 0,
    "skip_special_tokens_in_output": True,
    "spaces_between_special_tokens_in_out": True,
    "enable_precache_with_tracing": True,
    "enable_parallel_encoding": True,
}
PRINTS_TEXT_FROM = 2  # verbosity at which each finished program's text is printed


class GlobalConfig:
    def __init__(self) -> None:
        object.__setattr__(self, "_lock", threading.Lock())
        object.__setattr__(self, "_values", dict(DEFAULTS))

    @property
    def default_backend(self) -> Any:
        """The backend programs run on when given none (None: not set)."""
        return DEFAULT_BACKEND.peek()

    @default_backend.setter
    def default_backend(self, backend: Any) -> None:
        DEFAULT_BACKEND.set(backend)

    def __getattr__(self, name: str) -> Any:  # only for names that are not attributes
        if name in DEFAULTS:
            with self._lock:
                return self._values[name]
        raise AttributeError(f"global_config has no setting {name!r}: its settings are "
                             f"default_backend, {', '.join(DEFAULTS)}")

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "default_backend":
            object.__setattr__(self, name, value)  # the property's setter
            return
        if name not in DEFAULTS:
            raise AttributeError(f"global_config has no setting {name!r}: its settings are "
                                 f"default_backend, {', '.join(DEFAULTS)}")
        if name == "verbosity":
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"global_config.verbosity={value!r}: give an int >= 0")
        elif not isinstance(value, bool):
            raise ValueError(f"global_config.{name}={value!r}: give a bool")
        with self._lock:
            self._values[name] = value

    def reset(self) -> None:
        """Every setting but default_backend back to SGLang's default."""
        with self._lock:
            self._values.update(DEFAULTS)

    def __repr__(self) -> str:
        with self._lock:
            values = dict(self._values)
        return f"GlobalConfig(default_backend={self.default_backend!r}, {values})"


global_config = GlobalConfig()
