"""Planted bugs: small, realistic source patches of the kind LLM engines (vLLM, SGLang,
llama.cpp) have shipped, each with the tests that should catch it. Data only: the runner is
scripts/plant_bugs.py, the check that every patch still applies is
tests/system/test_planted_bugs.py.

Each bug replaces `old`, a snippet that occurs exactly once in `path` (relative to the repository
root), by `new`; `tests` are pytest targets (files or node ids) that should fail with it in
place, model-free ones first; `why` says what goes wrong for a user.
"""

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

BUGS: tuple[PlantedBug, ...] = (
    # --- radix cache ---------------------------------------------------------------------------
    PlantedBug(
        "radix-split-drops-lock", "radix cache", RADIX,
        "        upper.lock_count = node.lock_count  # on the path of everything below, none "
        "taken on it\n",
        "        upper.lock_count = 0  # a new node: nothing has locked it yet\n",
        (T_RADIX,),
        "splitting a locked node leaves its upper half unlocked, so eviction can free the KV of "
        "a prefix a running request is reading",
    ),
    PlantedBug(
        "radix-evicts-most-recent", "radix cache", RADIX,
        "            leaf = leaves[0]\n",
        "            leaf = leaves[-1]\n",
        (T_RADIX,),
        "eviction takes the most recently used leaf instead of the least, so the hot system "
        "prompt is recomputed while stale prefixes stay cached",
    ),
    PlantedBug(
        "radix-hit-not-touched", "radix cache", RADIX,
        "                child = self._split(child, n)\n            self._touch(child, now)\n"
        "            if child.tier == DEVICE_TIER:\n",
        "                child = self._split(child, n)\n"
        "            if child.tier == DEVICE_TIER:\n",
        (T_RADIX,),
        "a cache hit does not refresh the prefix's LRU position, so the prefix every request "
        "shares is evicted as if it were never used",
    ),
    PlantedBug(
        "radix-existing-len-short", "radix cache", RADIX,
        "            elif child.tier == tier:\n                existing_len = pos + n\n",
        "            elif child.tier == tier:\n                existing_len = pos\n",
        (T_RADIX,),
        "an insert under-reports how much of the key was already cached, so a prefix computed "
        "twice at once is never de-duplicated and holds twice the KV",
    ),
    PlantedBug(
        "radix-salt-falls-back-to-shared", "radix cache", RADIX,
        "        key = tuple(key[: len(key) // p * p])\n"
        "        node = self._roots.get(extra_key)\n",
        "        key = tuple(key[: len(key) // p * p])\n"
        "        node = self._roots.get(extra_key) or self._roots.get(None)\n",
        (T_RADIX,),
        "a request with a cache_salt whose namespace is empty matches the shared namespace, so "
        "it reuses (and can time) KV computed for other tenants",
    ),
    PlantedBug(
        "radix-unlock-loses-evictable-count", "radix cache", RADIX,
        "                self._locked_pages -= len(walk.pages)\n"
        "                self._evictable_pages += len(walk.pages)\n"
        "                if not walk.tier_children:\n"
        "                    self._leaves[DEVICE_TIER].add(walk)\n",
        "                self._locked_pages -= len(walk.pages)\n"
        "                if not walk.tier_children:\n"
        "                    self._leaves[DEVICE_TIER].add(walk)\n",
        (T_RADIX,),
        "unlocked pages are not counted as evictable, so the scheduler believes the pool is "
        "full and stalls or preempts while cached KV could be freed",
    ),
    # --- KV manager ----------------------------------------------------------------------------
    PlantedBug(
        "kv-page-count-floor", "KV manager", KV,
        "        return -(-num_positions // self.page_size)\n",
        "        return num_positions // self.page_size\n",
        (T_KV,),
        "the page count of a partly filled last page rounds down, so a request's last tokens "
        "get no page and write into another request's KV",
    ),
    PlantedBug(
        "kv-cow-skipped-for-tree-shared-page", "KV manager", KV,
        "        cow = filled and self.pool.refcount(req.pages[-1]) > 1\n",
        "        cow = filled and self.pool.refcount(req.pages[-1]) > 2\n",
        (T_KV, T_SIM),
        "a partly filled page shared by a request and the radix tree (or one fork sibling) is "
        "written in place instead of copied, corrupting the other holder's KV",
    ),
    PlantedBug(
        "kv-cow-old-page-not-decrefed", "KV manager", KV,
        "            self.pool.decref([old])\n            req.pages[-1] = new\n",
        "            req.pages[-1] = new\n",
        (T_KV,),
        "copy-on-write never drops the request's reference on the shared page it copied, so "
        "every n > 1 fork leaks a page until the pool runs dry",
    ),
    PlantedBug(
        "kv-lock-kept-on-uncached-release", "KV manager", KV,
        "            self.cache_prefix(req)\n        if req.tree_node is not None:\n",
        "            self.cache_prefix(req)\n        if req.tree_node is not None and cache:\n",
        (T_KV, T_SIM),
        "an aborted or swapped-out request keeps its lock on the radix path, so that prefix can "
        "never be evicted and the pool shrinks with every abort",
    ),
    PlantedBug(
        "kv-whole-prompt-matched", "KV manager", KV,
        "        limit = len(ids) - 1  # the last token is always computed: its logits are "
        "needed\n",
        "        limit = len(ids)\n",
        (T_KV, T_SIM),
        "a prompt that is wholly cached is admitted with nothing left to compute, so there are "
        "no logits to sample its first token from",
    ),
    PlantedBug(
        "pool-double-free-unchecked", "KV manager", POOL,
        "            if refcounts[page] < times:\n",
        "            if refcounts[page] < 1:\n",
        (T_POOL,),
        "a page listed twice in one decref passes the double-free check, its refcount goes "
        "negative and it is handed to two requests at once",
    ),
    # --- scheduler -----------------------------------------------------------------------------
    PlantedBug(
        "sched-swap-out-forgets-last-token", "scheduler", PREEMPTION,
        "            slots = self.kv.slots(victim, 0, victim.kv_len)\n",
        "            slots = self.kv.slots(victim, 0, victim.kv_len - 1)\n",
        (f"{T_SIM}::test_tight_pools_with_swapping_keep_every_invariant", T_PLANNER),
        "a swap preemption copies all but the last position's KV to host memory, so the "
        "request resumes with one token's KV missing and continues wrongly",
    ),
    PlantedBug(
        "sched-prefill-chunk-ignores-budget", "scheduler", PLANNER,
        "                chunk = min(req.remaining, draft.budget)\n"
        "                self._plan_chunk(req, chunk, draft, self._prompt_draft(req, chunk, "
        "draft))\n",
        "                chunk = req.remaining\n"
        "                self._plan_chunk(req, chunk, draft, self._prompt_draft(req, chunk, "
        "draft))\n",
        (T_PLANNER,),
        "a running prefill is planned whole instead of within the step's token budget, so a "
        "long prompt stalls every decode in the batch (no chunked prefill)",
    ),
    PlantedBug(
        "sched-victim-oldest-not-newest", "scheduler", PLANNER,
        "        victim = max(candidates, key=lambda r: (r.priority, r.admitted_at), "
        "default=None)\n",
        "        victim = max(candidates, key=lambda r: (r.priority, -r.admitted_at), "
        "default=None)\n",
        (T_PLANNER, T_SIM),
        "preemption for memory takes the oldest running request instead of the newest, "
        "throwing away the most computed work and starving long requests",
    ),
    PlantedBug(
        "sched-max-running-off-by-one", "scheduler", PLANNER,
        "                    or len(table.running) + reserved >= "
        "self.config.max_running_requests):\n",
        "                    or len(table.running) + reserved > "
        "self.config.max_running_requests):\n",
        (T_PLANNER, T_SIM),
        "admission lets one request more than max_running_requests run",
    ),
    PlantedBug(
        "sched-fair-weight-inverted", "scheduler", FAIR,
        "            self.virtual[tenant] = self.virtual.get(tenant, 0.0) + tokens / "
        "self.weight(tenant)\n",
        "            self.virtual[tenant] = self.virtual.get(tenant, 0.0) + tokens * "
        "self.weight(tenant)\n",
        (T_PRIORITIES, T_TABLE),
        "a tenant's weight slows its clock down instead of up, so a weight-2 tenant gets half "
        "its fair share instead of twice",
    ),
    PlantedBug(
        "sched-shared-pages-counted-per-request", "scheduler", FAIR,
        "        if (before == 0) != (before + change == 0):\n",
        "        if change:\n",
        (f"{T_PRIORITIES}::test_a_prompt_shared_by_a_tenants_requests_counts_once_toward_its_"
         "share", T_PRIORITIES),
        "a tenant's KV share counts a prompt its requests share once per request, so a tenant "
        "using the prefix cache well looks over its share and is preempted",
    ),
    PlantedBug(
        "sched-min-tokens-off-by-one", "scheduler", FOLDING,
        "        if num_out >= p.min_tokens:\n",
        "        if num_out > p.min_tokens:\n",
        (f"{T_PLANNER}::test_min_tokens_lets_a_stop_token_end_the_request_from_the_min_tokens_th"
         "_output", T_SIM),
        "an EOS or stop token sampled exactly at min_tokens does not end the output, which "
        "runs on one token (or to max_tokens) past where it should stop",
    ),
    # --- tiers ---------------------------------------------------------------------------------
    PlantedBug(
        "tiers-disk-read-before-write-done", "tiers", KV_TIERS,
        "        self.writer.wait(pages)\n",
        "",
        (T_KV_TIERS,),
        "a page moved up from disk is read before its write to the disk finished, so the "
        "request gets stale or zero KV and answers garbage",
    ),
    PlantedBug(
        "tiers-old-pages-freed-in-new-tier", "tiers", TIER_MOVER,
        "        self.free([(src, old)])\n",
        "        self.free([(tier, old)])\n",
        (T_TIER_MOVER,),
        "a page moved between tiers is freed in the pool it moved to instead of the one it "
        "left, leaking one tier and double-freeing the other",
    ),
    PlantedBug(
        "tiers-loading-path-demoted", "tiers", TIER_MOVER,
        "if id(n) not in self._loading),\n",
        "if n is not None),\n",
        (T_TIER_MOVER,),
        "making room in a lower tier may move down the very prefix being loaded back up, so "
        "the load-back half-finishes and the request recomputes it",
    ),
    PlantedBug(
        "tiers-node-size-off-by-one", "tiers", TIER_MOVER,
        "            if len(node.pages) <= self.pool(tier).num_pages:\n",
        "            if len(node.pages) < self.pool(tier).num_pages:\n",
        (T_TIER_MOVER,),
        "a prefix exactly the size of the host tier skips it and goes to disk (or is dropped), "
        "so its reload is slow or a recompute",
    ),
    PlantedBug(
        "tiers-torn-disk-data-trusted", "tiers", DISK_FORMAT,
        "            if zlib.crc32(os.pread(fd, geo.page_bytes, geo.data_offset_of(page))) != "
        "data_crc:\n"
        "                continue  # torn data, or the page's next occupant was being written\n",
        "",
        (T_DISK,),
        "a warm restart trusts a disk page's record without checking its data's CRC, so a "
        "page torn by a kill is served as KV and the answers are garbage",
    ),
    PlantedBug(
        "tiers-hit-counted-after-move", "tiers", TIER_MOVER,
        "                self.stats.hit_tokens[node.tier] += len(node.key)\n"
        "                self._move(node, DEVICE_TIER, pages)\n",
        "                self._move(node, DEVICE_TIER, pages)\n"
        "                self.stats.hit_tokens[node.tier] += len(node.key)\n",
        (T_TIER_MOVER, T_KV),
        "tokens loaded back from host or disk are counted as device hits, so the tier "
        "metrics say the lower tiers never serve anything",
    ),
    # --- worker --------------------------------------------------------------------------------
    PlantedBug(
        "worker-cow-slot-table-stale", "worker", WORKER,
        "            if copy.src != copy.dst:  # equal: only re-point the table (onto shared "
        "pages)\n"
        "                self.kv_cache.copy_slots(torch.tensor(copy.src), "
        "torch.tensor(copy.dst))\n",
        "            if copy.src != copy.dst:  # a real copy: the table keeps its slots\n"
        "                self.kv_cache.copy_slots(torch.tensor(copy.src), "
        "torch.tensor(copy.dst))\n"
        "                continue\n",
        (f"{T_WORKER}::test_copy_on_write_gives_the_request_its_own_copy",),
        "after copy-on-write the worker's slot table still points at the shared page, so the "
        "request overwrites its siblings' KV",
    ),
    PlantedBug(
        "worker-free-keeps-swapped-kv", "worker", WORKER,
        "            self.states.pop(rid, None)\n            self.swapped.pop(rid, None)\n",
        "            self.states.pop(rid, None)\n",
        (f"{T_WORKER}::test_an_aborted_swapped_out_request_leaves_no_host_kv",
         f"{T_WORKER}::test_free_forgets_the_request_and_its_swapped_kv", T_WORKER),
        "a swapped-out request that is aborted keeps its host copy of the KV forever: host "
        "memory leaks with every abort under swap preemption",
    ),
    PlantedBug(
        "worker-prompt-logprobs-shifted", "worker", WORKER,
        "                first = max(run.start, run.prompt_logprob_from - 1)\n",
        "                first = max(run.start, run.prompt_logprob_from)\n",
        (T_WORKER,),
        "prompt logprobs are read one row late, so each prompt token gets the logprob the model "
        "gave the token after it",
    ),
    PlantedBug(
        "worker-fork-children-share-seed", "worker", WORKER,
        "                seed_offset=i,\n                grammar=grammars.get(child),\n",
        "                seed_offset=parent.seed_offset,\n                "
        "grammar=grammars.get(child),\n",
        (f"{T_WORKER}::test_fork_children_sample_with_their_seed_offsets",),
        "the n samples of a seeded request all draw the same noise after the first token, so "
        "n > 1 with a seed returns n identical completions",
    ),
    PlantedBug(
        "worker-penalty-misses-latest-token", "worker", WORKER,
        "                        output_ids=TokenSpan(state.token_ids, state.prompt_len, "
        "known_len),\n",
        "                        output_ids=TokenSpan(state.token_ids, state.prompt_len, "
        "known_len - 1),\n",
        (T_WORKER,),
        "penalties and min_tokens see every output token but the latest, so the token just "
        "written is repeated despite a frequency or presence penalty",
    ),
    # --- sampler -------------------------------------------------------------------------------
    PlantedBug(
        "sampler-top-p-drops-crossing-token", "sampler", SAMPLER,
        "            mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs  # [m, vocab]\n",
        "            mass_before = sorted_probs.cumsum(dim=-1)  # [m, vocab]\n",
        (T_SAMPLER,),
        "top-p drops the token whose probability crosses the threshold (and, when the top "
        "token alone reaches it, every token), narrowing or breaking sampling",
    ),
    PlantedBug(
        "sampler-top-k-keeps-k-minus-one", "sampler", SAMPLER,
        "            x = x.masked_fill(x < kth.masked_fill(off, float(\"-inf\")), "
        "float(\"-inf\"))\n",
        "            x = x.masked_fill(x <= kth.masked_fill(off, float(\"-inf\")), "
        "float(\"-inf\"))\n",
        (T_SAMPLER,),
        "top-k keeps only the k-1 most likely tokens (top_k=1 keeps none), so sampling with "
        "top_k is narrower than asked or produces NaNs",
    ),
    PlantedBug(
        "sampler-seed-offset-ignored", "sampler", SAMPLER,
        "                    row_seed(row.params.seed, row.seed_offset, row.output_index))\n",
        "                    row_seed(row.params.seed, 0, row.output_index))\n",
        (T_SAMPLER, f"{T_WORKER}::test_fork_children_sample_with_their_seed_offsets"),
        "the seeded noise ignores which of the n samples a row is, so n > 1 with a seed "
        "returns n identical completions",
    ),
    PlantedBug(
        "sampler-repetition-penalty-boosts-negatives", "sampler", SAMPLER,
        "        penalised = torch.where(sub > 0, sub / penalty, sub * penalty)\n",
        "        penalised = sub / penalty\n",
        (T_SAMPLER,),
        "a repetition penalty divides negative logits too, which makes already-seen unlikely "
        "tokens more likely instead of less",
    ),
    PlantedBug(
        "sampler-logprobs-of-processed-logits", "sampler", SAMPLER,
        "            tokens[r] = self._race(probs, [rows[i] for i in random])\n"
        "        return self._logprobs(raw, tokens, params)\n",
        "            tokens[r] = self._race(probs, [rows[i] for i in random])\n"
        "        return self._logprobs(x, tokens, params)\n",
        (T_SAMPLER,),
        "logprobs are computed after bias, penalties and masks instead of from the model's raw "
        "distribution, so constrained or biased requests report -inf or skewed logprobs",
    ),
    PlantedBug(
        "sampler-logit-bias-bound-off-by-one", "sampler", PARAMS,
        "            for token_id in self.logit_bias:\n"
        "                if token_id >= vocab_size:\n",
        "            for token_id in self.logit_bias:\n                if token_id > vocab_size:\n",
        (f"{T_PARAMS}::test_validate_for_vocab",),
        "a logit_bias on token id == vocab_size passes validation and crashes the worker with "
        "an index error instead of a 400",
    ),
    PlantedBug(
        "sampler-min-p-absolute", "sampler", SAMPLER,
        "            floor = min_p * probs.max(dim=-1, keepdim=True).values  # [m, 1]\n",
        "            floor = min_p  # [m, 1]\n",
        (T_SAMPLER,),
        "min_p is applied as an absolute probability instead of relative to the top token, so "
        "on a flat distribution every token is dropped",
    ),
    # --- grammars ------------------------------------------------------------------------------
    PlantedBug(
        "grammar-draft-walk-not-rolled-back", "grammars", GRAMMAR_ROWS,
        "            state.rollback(len(at))\n",
        "            state.rollback(len(at) - 1)\n",
        (T_GRAMMAR_ROWS,),
        "after building the masks of drafted rows the grammar state is left one drafted token "
        "ahead, so the next sampled token is checked against the wrong state",
    ),
    PlantedBug(
        "grammar-rollback-past-eos-one-too-many", "grammars", GRAMMAR_ENGINE,
        "        text = n - 1 if self.ended else n  # the EOS ends the output: it is the last "
        "token\n",
        "        text = n\n",
        (f"{T_GRAMMAR_ENGINE}::test_rollback_gives_the_state_a_replay_gives", T_GRAMMAR_ROWS),
        "rolling back a rejected draft that ended with EOS undoes one text token too many, so "
        "the grammar state falls behind the output",
    ),
    PlantedBug(
        "grammar-forces-eos-where-text-may-follow", "grammars", OUTLINES_GRAMMAR,
        "        if len(tokens) < MAX_FORCED_TOKENS and self._only_end(end):\n",
        "        if len(tokens) < MAX_FORCED_TOKENS and self.accepts_end(end):\n",
        (T_GRAMMAR,),
        "jump-forward appends EOS wherever the output may end, cutting `\\d+` after one digit "
        "or a JSON array after its first item",
    ),
    PlantedBug(
        "grammar-jump-forward-past-max-tokens", "grammars", GRAMMAR_ROWS,
        "    room = max_tokens - (len(token_ids) - prompt_len)\n",
        "    room = max_tokens - (len(token_ids) - prompt_len - 1)\n",
        (f"{T_GRAMMAR_ROWS}::test_after_sample_appends_forced_tokens_within_max_tokens",),
        "jump-forward appends one forced token past max_tokens, so constrained outputs are "
        "longer than asked and usage is over-billed",
    ),
    PlantedBug(
        "grammar-drafted-eos-always-allowed", "grammars", GRAMMAR_ROWS,
        "    if token in state.grammar.table.eos_token_ids:\n        return may_end\n",
        "    if token in state.grammar.table.eos_token_ids:\n        return True\n",
        (f"{T_GRAMMAR_ROWS}::test_a_drafted_eos_is_allowed_only_where_the_grammar_may_end",
         T_GRAMMAR_ROWS),
        "a drafted EOS (a chat prompt's own end-of-turn token, drafted from the request's "
        "context) passes the check where the grammar may not end, and advancing the grammar "
        "past it fails the step: the server exits",
    ),
    # --- speculation ---------------------------------------------------------------------------
    PlantedBug(
        "spec-accepts-past-stop-token", "speculation", VERIFIER,
        "        if child is None or x in stops or (goes_on is not None and not goes_on(x)):\n",
        "        if child is None or (goes_on is not None and not goes_on(x)):\n",
        (T_VERIFIER,),
        "verification accepts drafted tokens after a sampled EOS or stop token, so outputs "
        "run on past where they ended",
    ),
    PlantedBug(
        "spec-kept-slots-reversed", "speculation", VERIFIER,
        "    return [(node, d) for d, node in enumerate(accepted) if node != d]\n",
        "    return [(d, node) for d, node in enumerate(accepted) if node != d]\n",
        (T_VERIFIER, f"{T_WORKER}::test_a_draft_tree_follows_the_branch_its_samples_take"),
        "when a draft tree's branch is accepted its K/V is copied the wrong way, so later "
        "tokens attend to the rejected branch's keys",
    ),
    PlantedBug(
        "spec-rejected-position-kept", "speculation", FOLDING,
        "        self.kv.truncate(req, run.known_end + len(accepted))\n",
        "        self.kv.truncate(req, run.known_end + len(accepted) + 1)\n",
        (f"{T_SIM}::test_draft_trees_are_verified_down_the_branch_the_samples_take",),
        "the KV of the first rejected draft position is kept, so the request's next token is "
        "computed after a token that was never emitted",
    ),
    PlantedBug(
        "spec-draft-length-shrinks-to-accepted", "speculation", SPECULATOR,
        "            state.length = (min(self.num_draft_tokens, 2 * state.length + 1) if full\n"
        "                            else accepted + 1)\n",
        "            state.length = (min(self.num_draft_tokens, 2 * state.length + 1) if full\n"
        "                            else accepted)\n",
        (T_SPECULATOR,),
        "after a draft is rejected at its first token the request's draft length becomes 0 and "
        "it never drafts again: speculative decoding silently switches off",
    ),
    PlantedBug(
        "spec-draft-room-ignores-sampled-token", "speculation", PLANNER,
        "        room = min(req.max_tokens - len(req.output_ids) - 1,\n",
        "        room = min(req.max_tokens - len(req.output_ids),\n",
        (f"{T_PLANNER}::test_a_draft_never_runs_past_max_tokens", T_SIM, T_PLANNER),
        "a draft may reach max_tokens without counting the token sampled after it, so KV is "
        "reserved (and the step computed) for a position past the output's end",
    ),
    PlantedBug(
        "spec-worker-keeps-rejected-slot", "speculation", WORKER,
        "        del state.slots[end + len(nodes) :]\n",
        "        del state.slots[end + len(nodes) + 1 :]\n",
        (f"{T_WORKER}::test_a_draft_tree_follows_the_branch_its_samples_take",),
        "the worker keeps the slot of the first rejected draft in the request's table, so the "
        "next step's run starts one position late",
    ),
    PlantedBug(
        "spec-index-keeps-evicted-tokens", "speculation", DRAFT_INDEX,
        "            self._unfile(self._key(leaf.extra_key, run.tokens, p), run, p)\n"
        "        run.alive = start\n",
        "            self._unfile(self._key(leaf.extra_key, run.tokens, p), run, p)\n",
        (f"{T_DRAFT_INDEX}::test_drafts_never_follow_evicted_tokens", T_DRAFT_INDEX),
        "the draft index keeps drafting tokens whose nodes were evicted, so drafts follow text "
        "that is no longer cached and are rejected, wasting every verified row",
    ),
    # --- server --------------------------------------------------------------------------------
    PlantedBug(
        "server-stop-string-kept-in-output", "server", DETOKENIZER,
        "            return self._emit(buf[:pos])\n",
        "            return self._emit(buf[:pos + len(stop)])\n",
        (T_TRACKER, T_DETOK),
        "the stop string that ended the output is returned with it (OpenAI trims it)",
    ),
    PlantedBug(
        "server-held-text-dropped-at-end", "server", DETOKENIZER,
        "        keep = 0 if final else self._partial_stop_len(buf)\n",
        "        keep = self._partial_stop_len(buf)\n",
        (T_TRACKER, T_DETOK),
        "text held back because it might begin a stop string is dropped when the output ends, "
        "so the stream loses its last delta",
    ),
    PlantedBug(
        "server-finish-replaces-last-text", "server", OUTPUT_TRACKER,
        "            text += detok.finish()\n",
        "            text = detok.finish()\n",
        (T_TRACKER,),
        "the text of the final delta is replaced by what the detokenizer flushes, so the last "
        "tokens of every stream and completion go missing",
    ),
    PlantedBug(
        "server-queue-full-is-503", "server", HTTP_STREAMING,
        "    return APIError(message, status=429, code=\"queue_full\", "
        "type=\"rate_limit_exceeded\",\n",
        "    return APIError(message, status=503, code=\"queue_full\", "
        "type=\"rate_limit_exceeded\",\n",
        (f"{T_TENANTS}::test_a_full_queue_is_a_429_with_retry_after_and_the_server_serves_on",),
        "a full queue answers 503 instead of 429, which clients treat as a server fault rather "
        "than back-pressure to retry after Retry-After",
    ),
    PlantedBug(
        "server-queue-timeout-says-retry", "server", HTTP_STREAMING,
        "                           headers={SHOULD_RETRY_HEADER: \"false\"})\n",
        "                           headers={SHOULD_RETRY_HEADER: \"true\"})\n",
        (f"{T_TENANTS}::test_a_request_waiting_past_its_timeout_is_a_408",),
        "a queue timeout tells the OpenAI and Anthropic clients to retry, so a congested server "
        "gets every timed-out request again",
    ),
    PlantedBug(
        "server-user-field-overrides-key-tenant", "server", TENANTS,
        "    if named is not None:\n        return named\n    return user or \"\"\n",
        "    if user:\n        return user\n    return named or \"\"\n",
        (f"{T_TENANTS}::test_the_tenant_is_the_keys_name_else_user_else_shared",),
        "a client with a named API key can charge its requests to any tenant by setting the "
        "OpenAI `user` field, escaping its fair share",
    ),
    PlantedBug(
        "server-text-offset-after-token", "server", LOGPROB_FORMATS,
        "        out.text_offset.append(offset)\n        offset += len(text)\n",
        "        offset += len(text)\n        out.text_offset.append(offset)\n",
        (T_LOGPROB_FORMATS,),
        "legacy completions logprobs give each token's end as its text_offset, off by one "
        "token for every client that maps logprobs back to the text",
    ),
    # --- DSL -----------------------------------------------------------------------------------
    PlantedBug(
        "dsl-select-not-length-normalized", "DSL", SELECT,
        "        return [sum(c.logprobs) / len(c.logprobs) for c in scored]\n",
        "        return [sum(c.logprobs) for c in scored]\n",
        (f"{T_API}::test_select_scores_equal_a_direct_computation",),
        "select's token_length_normalized sums log-probabilities instead of averaging them, so "
        "it prefers whichever choice has the fewest tokens",
    ),
    PlantedBug(
        "dsl-select-tie-goes-to-later-choice", "DSL", SELECT,
        "        best = max(range(len(scores)), key=lambda i: (scores[i], -i))\n",
        "        best = max(range(len(scores)), key=lambda i: (scores[i], i))\n",
        (f"{T_PROGRAM}::test_a_select_whose_choices_tie_picks_the_first", T_PROGRAM),
        "a select whose choices score equally picks the last one instead of the first "
        "(SGLang's rule), so programs branch differently",
    ),
    PlantedBug(
        "dsl-concat-join-keeps-pin", "DSL", STATE,
        "            if self._handle is not None:\n"
        "                self.parent._executor.unpin(self._handle)\n",
        "            if self._handle is not None and mode == \"gather_variable\":\n"
        "                self.parent._executor.unpin(self._handle)\n",
        (f"{T_PROGRAM}::test_a_join_releases_the_forks_prefix_in_either_mode", T_PROGRAM,
         f"{T_SGLANG_NAMES}::test_fork_item_appends_lambda_appends_and_both_join_modes"),
        "a fork joined with concate_and_append never unpins the prefix it pinned, so its KV "
        "stays locked in the runtime until the pin budget is exhausted",
    ),
    PlantedBug(
        "dsl-speculated-value-keeps-stop", "DSL", DSL_SPECULATION,
        "            cut, reason = stop_at[0], \"stop\"\n",
        "            cut, reason = stop_at[0] + stop_at[1], \"stop\"\n",
        (T_DSL_SPECULATION,),
        "under API speculation a gen's value includes its stop string, unlike the same gen "
        "without speculation",
    ),
    PlantedBug(
        "dsl-fork-shares-messages", "DSL", TRANSCRIPT,
        "        return Transcript(self.chat, self.text, [dict(m) for m in self.messages], "
        "self.role,\n",
        "        return Transcript(self.chat, self.text, self.messages, self.role,\n",
        (f"{T_PROGRAM}::test_each_fork_has_its_own_messages", T_PROGRAM),
        "forks share one messages list with their parent, so s.messages() of every branch shows "
        "the other branches' turns",
    ),
    PlantedBug(
        "dsl-preamble-on-every-role", "DSL", TRANSCRIPT,
        "        self.seen_role = True\n",
        "",
        (T_PROGRAM,),
        "the chat template's default system prompt is inserted before every user and "
        "assistant turn instead of once",
    ),
    PlantedBug(
        "dsl-speculation-keyed-on-max-tokens", "DSL", DSL_SPECULATION,
        "CUT_BY = (\"stop\", \"max_tokens\")\n",
        "CUT_BY = (\"stop\",)\n",
        (T_DSL_SPECULATION,),
        "gens with different max_tokens never take from a speculation, so API speculation "
        "saves no calls in the usual program",
    ),
)
