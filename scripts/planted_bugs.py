"""Planted bugs: small, realistic source patches of the kind LLM engines (vLLM, SGLang,
llama.cpp) have shipped, each with the tests that should catch it. Data only: the runner is
scripts/plant_bugs.py, the check that every patch still applies is
tests/system/test_planted_bugs.py.

Each bug replaces `old`, a snippet that occurs exactly once in `path` (relative to the repository
root), by `new`; `tests` are pytest targets (files or node ids) that should fail with it in
place, model-free ones first; `why` says what goes wrong for a user.
"""

from __future__ import annotations

from planted_bug import (
    AREAS,
    DETOKENIZER,
    DRAFT_INDEX,
    DSL_SPECULATION,
    FOLDING,
    GRAMMAR_ENGINE,
    GRAMMAR_ROWS,
    HTTP_STREAMING,
    LOGPROB_FORMATS,
    OUTLINES_GRAMMAR,
    OUTPUT_TRACKER,
    PARAMS,
    PLANNER,
    SAMPLER,
    SELECT,
    SPECULATOR,
    STATE,
    T_API,
    T_DETOK,
    T_DRAFT_INDEX,
    T_DSL_SPECULATION,
    T_GRAMMAR,
    T_GRAMMAR_ENGINE,
    T_GRAMMAR_ROWS,
    T_LOGPROB_FORMATS,
    T_PARAMS,
    T_PLANNER,
    T_PROGRAM,
    T_SAMPLER,
    T_SGLANG_NAMES,
    T_SIM,
    T_SPECULATOR,
    T_TENANTS,
    T_TRACKER,
    T_VERIFIER,
    T_WORKER,
    TENANTS,
    TRANSCRIPT,
    VERIFIER,
    WORKER,
    PlantedBug,
)
from planted_bugs_memory import MEMORY_BUGS

__all__ = ["AREAS", "BUGS", "PlantedBug"]

BUGS: tuple[PlantedBug, ...] = MEMORY_BUGS + (
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
