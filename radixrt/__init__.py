"""radixrt: a radix-tree-centric structured-generation runtime.

Public API only: the DSL (function, gen, select, fork via the state, roles, Runtime,
RuntimeEndpoint, OpenAICompatible, global_config) and the in-process Engine. `radixrt.lang.ir`
holds what SGLang programs import from `sglang.lang.ir` (its regex building blocks). Everything
loads on first use, and the DSL never imports torch, so a frontend that talks to a remote runtime
stays light.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from radixrt.runtime.config import EngineConfig
from radixrt.runtime.sampling_params import SamplingParams

if TYPE_CHECKING:
    from radixrt.runtime.engine import Engine
    from radixrt.runtime.outputs import CompletionOutput, RequestOutput, StreamChunk

__all__ = [
    "Backend",
    "ChatFormat",
    "ChoiceLogprobs",
    "GenResult",
    "BackendError",
    "ForkGroup",
    "GlobalConfig",
    "OpenAICompatible",
    "Program",
    "ProgramState",
    "Runtime",
    "RuntimeEndpoint",
    "SelectMethod",
    "TokenUsage",
    "assistant",
    "assistant_begin",
    "assistant_end",
    "embed",
    "flush_cache",
    "function",
    "gen",
    "gen_int",
    "gen_string",
    "get_server_info",
    "global_config",
    "greedy_token_selection",
    "image",
    "select",
    "set_default_backend",
    "system",
    "system_begin",
    "system_end",
    "token_length_normalized",
    "tool",
    "tool_prompt",
    "ToolCall",
    "function_tool",
    "unconditional_likelihood_normalized",
    "user",
    "user_begin",
    "user_end",
    "CompletionOutput",
    "Engine",
    "EngineConfig",
    "QueueFull",
    "RequestOutput",
    "SamplingParams",
    "StreamChunk",
]
__version__ = "0.1.0"

_LAZY = {
    "Engine": "radixrt.runtime.engine",
    "RequestOutput": "radixrt.runtime.outputs",
    "CompletionOutput": "radixrt.runtime.outputs",
    "StreamChunk": "radixrt.runtime.outputs",
    "QueueFull": "radixrt.runtime.errors",
    "OpenAICompatible": "radixrt.frontend.backends.openai_backend",
    "BackendError": "radixrt.frontend",
    "GenResult": "radixrt.frontend",
    "ChoiceLogprobs": "radixrt.frontend",
    "ChatFormat": "radixrt.frontend",
    "Backend": "radixrt.frontend",
    "ForkGroup": "radixrt.frontend",
    "Program": "radixrt.frontend",
    "ProgramState": "radixrt.frontend",
    "Runtime": "radixrt.frontend",
    "RuntimeEndpoint": "radixrt.frontend",
    "assistant": "radixrt.frontend",
    "tool": "radixrt.frontend",
    "tool_prompt": "radixrt.frontend",
    "ToolCall": "radixrt.frontend",
    "function_tool": "radixrt.frontend",
    "SelectMethod": "radixrt.frontend",
    "flush_cache": "radixrt.frontend",
    "gen_int": "radixrt.frontend",
    "gen_string": "radixrt.frontend",
    "get_server_info": "radixrt.frontend",
    "greedy_token_selection": "radixrt.frontend",
    "token_length_normalized": "radixrt.frontend",
    "unconditional_likelihood_normalized": "radixrt.frontend",
    "function": "radixrt.frontend",
    "embed": "radixrt.frontend",
    "gen": "radixrt.frontend",
    "image": "radixrt.frontend",
    "select": "radixrt.frontend",
    "set_default_backend": "radixrt.frontend",
    "system": "radixrt.frontend",
    "user": "radixrt.frontend",
    **{name: "radixrt.frontend" for name in (
        "GlobalConfig", "TokenUsage", "assistant_begin", "assistant_end", "global_config",
        "system_begin", "system_end", "user_begin", "user_end")},
}


# SGLang frontend names radixrt does not have, and what to use instead
_SGLANG_INSTEAD = {
    "video": "radixrt takes images (image(path_or_bytes)), not video",
    "OpenAI": "rx.OpenAICompatible(base_url, model) runs programs on any OpenAI-compatible "
              "server",
    "Anthropic": "rx.OpenAICompatible(base_url, model) with an OpenAI-compatible proxy",
    "VertexAI": "rx.OpenAICompatible(base_url, model) with an OpenAI-compatible proxy",
    "LiteLLM": "rx.OpenAICompatible(base_url, model) against a LiteLLM proxy",
    "separate_reasoning": "radixrt's reasoning parser is a server option, not a DSL call: "
                          "gen(..., separate_reasoning=True) on a runtime started with "
                          "--reasoning-parser",
    "Crusoe": "rx.OpenAICompatible(base_url, model) against its OpenAI-compatible API",
    "ServerArgs": "rx.Runtime(**server_options) takes `radixrt serve`'s flags as keywords; "
                  "rx.EngineConfig configures the in-process rx.Engine",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        if name in _SGLANG_INSTEAD:
            raise AttributeError(f"SGLang's {name} is not part of radixrt: "
                                 f"{_SGLANG_INSTEAD[name]}")
        raise AttributeError(f"module 'radixrt' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
