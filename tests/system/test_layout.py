"""The tests mirror the source tree, so a module's tests are found by its name: every test file
outside tests/system/ is test_<module>.py or test_<module>_<aspect>.py in the folder mirroring its
module's package (tests/layout.py has the rules), and the modules without a test file are listed
here, so that a new one, or a listed one that gets its file, changes this list on purpose."""

from __future__ import annotations

from layout import layout_problems, untested_modules

# The modules no test file is named after (many are tested through a neighbour's tests: the
# scheduler's parts through test_planner.py and test_scheduler_sim.py, the families through
# test_decoder_families.py). Sorted; `python tests/layout.py` prints the current list.
WITHOUT_TEST_FILE = (
    "radixrt/config_flags.py",
    "radixrt/frontend/backends/http_client.py",
    "radixrt/frontend/backends/http_endpoint.py",
    "radixrt/frontend/backends/lease_keeper.py",
    "radixrt/frontend/backends/local_runtime.py",
    "radixrt/frontend/backends/next_token_scoring.py",
    "radixrt/frontend/backends/prefix_tree.py",
    "radixrt/frontend/backends/program_replica.py",
    "radixrt/frontend/backends/runtime_endpoint.py",
    "radixrt/frontend/backends/zmq_client.py",
    "radixrt/frontend/backends/zmq_endpoint.py",
    "radixrt/frontend/lang/backend.py",
    "radixrt/frontend/lang/executor.py",
    "radixrt/frontend/lang/ir.py",
    "radixrt/frontend/lang/select_methods.py",
    "radixrt/frontend/lang/state.py",
    "radixrt/frontend/lang/tracer.py",
    "radixrt/frontend/lang/transcript.py",
    "radixrt/kernels/lora_reference.py",
    "radixrt/kernels/moe_reference.py",
    "radixrt/kernels/packed_reference.py",
    "radixrt/kernels/reference_lse.py",
    "radixrt/kernels/store_kv.py",
    "radixrt/kernels/triton_utils.py",
    "radixrt/plan_cli.py",
    "radixrt/runtime/config.py",
    "radixrt/runtime/constrained/json_bounds.py",
    "radixrt/runtime/constrained/token_table.py",
    "radixrt/runtime/distributed/group.py",
    "radixrt/runtime/engine_link.py",
    "radixrt/runtime/errors.py",
    "radixrt/runtime/forward/attention/base.py",
    "radixrt/runtime/forward/attention/decode_layout.py",
    "radixrt/runtime/forward/attention/torch_backend.py",
    "radixrt/runtime/forward/forward_batch.py",
    "radixrt/runtime/forward/kv_cache.py",
    "radixrt/runtime/forward/lora_batch.py",
    "radixrt/runtime/helper_main.py",
    "radixrt/runtime/ipc.py",
    "radixrt/runtime/launcher.py",
    "radixrt/runtime/lora_messages.py",
    "radixrt/runtime/messages.py",
    "radixrt/runtime/models/families/family.py",
    "radixrt/runtime/models/families/gemma.py",
    "radixrt/runtime/models/families/gpt_oss.py",
    "radixrt/runtime/models/families/granite.py",
    "radixrt/runtime/models/families/mixtral.py",
    "radixrt/runtime/models/families/olmo2.py",
    "radixrt/runtime/models/families/olmoe.py",
    "radixrt/runtime/models/families/phi3.py",
    "radixrt/runtime/models/families/qwen_moe.py",
    "radixrt/runtime/models/families/smollm3.py",
    "radixrt/runtime/models/gguf_archs.py",
    "radixrt/runtime/models/gguf_config.py",
    "radixrt/runtime/models/gguf_experts.py",
    "radixrt/runtime/models/gguf_file.py",
    "radixrt/runtime/models/gguf_meta.py",
    "radixrt/runtime/models/gguf_moe.py",
    "radixrt/runtime/models/gguf_quants.py",
    "radixrt/runtime/models/hf_loader.py",
    "radixrt/runtime/models/layers.py",
    "radixrt/runtime/models/loader.py",
    "radixrt/runtime/models/lora_layer.py",
    "radixrt/runtime/models/lora_weights.py",
    "radixrt/runtime/models/model_config.py",
    "radixrt/runtime/models/moe.py",
    "radixrt/runtime/models/registry.py",
    "radixrt/runtime/models/rope.py",
    "radixrt/runtime/models/tensor_source.py",
    "radixrt/runtime/outputs.py",
    "radixrt/runtime/replicas/deployment.py",
    "radixrt/runtime/replicas/router.py",
    "radixrt/runtime/scheduler/fair_share.py",
    "radixrt/runtime/scheduler/folding.py",
    "radixrt/runtime/scheduler/in_flight.py",
    "radixrt/runtime/scheduler/intake.py",
    "radixrt/runtime/scheduler/lora_table.py",
    "radixrt/runtime/scheduler/policy.py",
    "radixrt/runtime/scheduler/preemption.py",
    "radixrt/runtime/scheduler/queue_order.py",
    "radixrt/runtime/scheduler/request.py",
    "radixrt/runtime/scheduler/scheduler_process.py",
    "radixrt/runtime/scheduler/stats.py",
    "radixrt/runtime/scheduler/step_draft.py",
    "radixrt/runtime/server/anthropic/anthropic_routes.py",
    "radixrt/runtime/server/core/http_metrics.py",
    "radixrt/runtime/server/core/http_middleware.py",
    "radixrt/runtime/server/core/http_replica.py",
    "radixrt/runtime/server/core/http_streaming.py",
    "radixrt/runtime/server/core/lora_routes.py",
    "radixrt/runtime/server/core/operations_routes.py",
    "radixrt/runtime/server/core/typed_union.py",
    "radixrt/runtime/server/dsl/dsl_endpoint.py",
    "radixrt/runtime/server/dsl/dsl_scoring.py",
    "radixrt/runtime/server/native/native_routes.py",
    "radixrt/runtime/server/openai/chat_output.py",
    "radixrt/runtime/server/openai/chat_tool_plan.py",
    "radixrt/runtime/server/openai/openai_routes.py",
    "radixrt/runtime/server/openai/reasoning_parsers.py",
    "radixrt/runtime/server/openai/tool_call_deltas.py",
    "radixrt/runtime/server/openai/tool_protocol.py",
    "radixrt/runtime/server/pooling/pooling_protocol.py",
    "radixrt/runtime/server/pooling/pooling_routes.py",
    "radixrt/runtime/server/responses/responses_routes.py",
    "radixrt/runtime/server_options.py",
    "radixrt/runtime/tokenizer/chat_roles.py",
    "radixrt/runtime/tokenizer/chat_tool_prompts.py",
    "radixrt/runtime/tokenizer/prompts.py",
    "radixrt/runtime/tokenizer/request_front.py",
    "radixrt/runtime/tokenizer/request_metrics.py",
    "radixrt/runtime/tokenizer/zmq_link.py",
    "radixrt/runtime/trace_messages.py",
    "radixrt/runtime/tree_messages.py",
    "radixrt/runtime/worker/cuda_graph.py",
    "radixrt/runtime/worker/lora_manager.py",
    "radixrt/runtime/worker/setup.py",
    "radixrt/runtime/worker/step_executor.py",
    "radixrt/runtime/worker/step_rows.py",
    "radixrt/runtime/worker/worker_process.py",
)


def test_every_test_file_sits_beside_its_module() -> None:
    assert layout_problems() == []


def test_the_modules_without_a_test_file_are_the_listed_ones() -> None:
    untested = tuple(untested_modules())
    added = sorted(set(untested) - set(WITHOUT_TEST_FILE))
    removed = sorted(set(WITHOUT_TEST_FILE) - set(untested))
    assert untested == WITHOUT_TEST_FILE, (
        "the modules without a test file changed: update WITHOUT_TEST_FILE in "
        f"tests/system/test_layout.py (sorted). Add (no test file): {added}; remove (has a "
        f"test file now, or is gone): {removed}"
    )
