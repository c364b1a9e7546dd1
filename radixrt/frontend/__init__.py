"""The DSL: `@function` programs that append text, gen, select and roles to a state, fork it,
and run on a backend (a local `Runtime`, a `RuntimeEndpoint`, or an `OpenAICompatible` server)."""

from radixrt.frontend.backends.local_runtime import Runtime
from radixrt.frontend.backends.runtime_endpoint import RuntimeEndpoint
from radixrt.frontend.lang.api import (
    assistant,
    flush_cache,
    gen,
    gen_int,
    gen_string,
    get_server_info,
    select,
    set_default_backend,
    system,
    tool,
    tool_prompt,
    user,
)
from radixrt.frontend.lang.backend import (
    Backend,
    BackendError,
    ChatFormat,
    ChoiceLogprobs,
    GenResult,
)
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
    "Program",
    "ProgramState",
    "Runtime",
    "RuntimeEndpoint",
    "SelectMethod",
    "assistant",
    "flush_cache",
    "function",
    "gen",
    "gen_int",
    "gen_string",
    "get_server_info",
    "greedy_token_selection",
    "select",
    "set_default_backend",
    "system",
    "token_length_normalized",
    "tool",
    "tool_prompt",
    "ToolCall",
    "function_tool",
    "unconditional_likelihood_normalized",
    "user",
]
