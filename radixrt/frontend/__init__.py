"""The DSL: `@function` programs that append text, images, gen, select and roles to a state,
fork it, and run on a backend (a local `Runtime`, a `RuntimeEndpoint`, or an `OpenAICompatible`
server)."""

from radixrt.frontend.backends.local_runtime import Runtime
from radixrt.frontend.backends.runtime_endpoint import RuntimeEndpoint
from radixrt.frontend.lang.api import (
    assistant,
    assistant_begin,
    assistant_end,
    embed,
    flush_cache,
    gen,
    gen_int,
    gen_string,
    get_server_info,
    image,
    select,
    set_default_backend,
    system,
    system_begin,
    system_end,
    tool,
    tool_prompt,
    user,
    user_begin,
    user_end,
)
from radixrt.frontend.lang.backend import (
    Backend,
    BackendError,
    ChatFormat,
    ChoiceLogprobs,
    GenResult,
    TokenUsage,
)
from radixrt.frontend.lang.global_config import GlobalConfig, global_config
from radixrt.frontend.lang.program import Program, function
from radixrt.frontend.lang.select_methods import (
    SelectMethod,
    greedy_token_selection,
    token_length_normalized,
    unconditional_likelihood_normalized,
)
from radixrt.frontend.lang.state import ForkGroup, ProgramState
from radixrt.frontend.lang.tools import ToolCall, function_tool

__all__ = [
    "Backend",
    "BackendError",
    "ChatFormat",
    "ChoiceLogprobs",
    "GenResult",
    "ForkGroup",
    "GlobalConfig",
    "Program",
    "ProgramState",
    "Runtime",
    "RuntimeEndpoint",
    "SelectMethod",
    "TokenUsage",
    "assistant",
    "assistant_begin",
    "assistant_end",
    "flush_cache",
    "function",
    "embed",
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
]
