"""What a planted bug is (PlantedBug), the areas they cover, and the files they patch and the
tests meant to catch them, named once for scripts/planted_bugs.py and
scripts/planted_bugs_memory.py."""

from __future__ import annotations

from dataclasses import dataclass

AREAS = ("scheduler", "radix cache", "KV manager", "tiers", "worker", "sampler", "grammars",
         "speculation", "server", "DSL")


@dataclass(frozen=True)
class PlantedBug:
    name: str
    area: str  # one of AREAS
    path: str  # the file patched, relative to the repository root
    old: str  # occurs exactly once in `path`
    new: str  # the buggy replacement
    tests: tuple[str, ...]  # pytest targets that should catch it
    why: str  # what goes wrong for a user


RADIX = "radixrt/runtime/scheduler/radix_cache.py"
KV = "radixrt/runtime/scheduler/kv_manager.py"
POOL = "radixrt/runtime/scheduler/page_pool.py"
PLANNER = "radixrt/runtime/scheduler/planner.py"
PREEMPTION = "radixrt/runtime/scheduler/preemption.py"
FAIR = "radixrt/runtime/scheduler/fair_share.py"
FOLDING = "radixrt/runtime/scheduler/folding.py"
TIER_MOVER = "radixrt/runtime/scheduler/tier_mover.py"
KV_TIERS = "radixrt/runtime/worker/kv_tiers.py"
DISK_FORMAT = "radixrt/runtime/worker/disk_format.py"
WORKER = "radixrt/runtime/worker/worker.py"
SAMPLER = "radixrt/runtime/worker/sampler.py"
PARAMS = "radixrt/runtime/sampling_params.py"
GRAMMAR_ROWS = "radixrt/runtime/worker/grammar_rows.py"
GRAMMAR_ENGINE = "radixrt/runtime/constrained/grammar_engine.py"
OUTLINES_GRAMMAR = "radixrt/runtime/constrained/grammar.py"
SPECULATOR = "radixrt/runtime/scheduler/speculator.py"
VERIFIER = "radixrt/runtime/worker/draft_verifier.py"
DRAFT_INDEX = "radixrt/runtime/scheduler/draft_index.py"
DETOKENIZER = "radixrt/runtime/tokenizer/detokenizer.py"
OUTPUT_TRACKER = "radixrt/runtime/tokenizer/output_tracker.py"
HTTP_STREAMING = "radixrt/runtime/server/core/http_streaming.py"
TENANTS = "radixrt/runtime/server/core/tenants.py"
LOGPROB_FORMATS = "radixrt/runtime/server/openai/logprob_formats.py"
SELECT = "radixrt/frontend/lang/select_methods.py"
STATE = "radixrt/frontend/lang/state.py"
TRANSCRIPT = "radixrt/frontend/lang/transcript.py"
DSL_SPECULATION = "radixrt/frontend/lang/speculation.py"

T_RADIX = "tests/runtime/scheduler/test_radix_cache.py"
T_KV = "tests/runtime/scheduler/test_kv_manager.py"
T_POOL = "tests/runtime/scheduler/test_page_pool.py"
T_PLANNER = "tests/runtime/scheduler/test_planner.py"
T_SIM = "tests/runtime/scheduler/test_scheduler_sim.py"
T_PRIORITIES = "tests/runtime/scheduler/test_scheduler_priorities.py"
T_TABLE = "tests/runtime/scheduler/test_request_table.py"
T_TIER_MOVER = "tests/runtime/scheduler/test_tier_mover.py"
T_KV_TIERS = "tests/runtime/worker/test_kv_tiers.py"
T_DISK = "tests/runtime/worker/test_disk_format.py"
T_WORKER = "tests/runtime/worker/test_worker.py"
T_SAMPLER = "tests/runtime/worker/test_sampler.py"
T_PARAMS = "tests/runtime/test_sampling_params.py"
T_GRAMMAR_ROWS = "tests/runtime/worker/test_grammar_rows.py"
T_GRAMMAR = "tests/runtime/constrained/test_grammar.py"
T_GRAMMAR_ENGINE = "tests/runtime/constrained/test_grammar_engine.py"
T_SPECULATOR = "tests/runtime/scheduler/test_speculator.py"
T_VERIFIER = "tests/runtime/worker/test_draft_verifier.py"
T_DRAFT_INDEX = "tests/runtime/scheduler/test_draft_index.py"
T_DETOK = "tests/runtime/tokenizer/test_detokenizer.py"
T_TRACKER = "tests/runtime/tokenizer/test_output_tracker.py"
T_TENANTS = "tests/runtime/server/core/test_tenants.py"
T_LOGPROB_FORMATS = "tests/runtime/server/openai/test_logprob_formats.py"
T_PROGRAM = "tests/frontend/lang/test_program.py"
T_DSL_SPECULATION = "tests/frontend/lang/test_speculation.py"
T_API = "tests/frontend/lang/test_api.py"
T_SGLANG_NAMES = "tests/frontend/lang/test_sglang_names.py"

