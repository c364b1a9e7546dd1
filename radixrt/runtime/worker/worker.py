"""The worker: owns the model, the KV tensors and sampling; executes one StepPlan at a time.

It keeps per-request state (token ids, slot table) so the scheduler's plans carry deltas only.
"""

from __future__ import annotations

import msgspec
import torch

from radixrt.runtime.config import DEFAULT_GRAMMAR_BACKEND, DEFAULT_GRAMMAR_COMPILE_TIMEOUT_S
from radixrt.runtime.constrained.compiler import GrammarCompiler
from radixrt.runtime.constrained.grammar_engine import Grammar, GrammarState
from radixrt.runtime.constrained.token_table import TokenTable
from radixrt.runtime.forward.forward_batch import ForwardBatch, PrefixGroup
from radixrt.runtime.forward.kv_cache import KVCache
from radixrt.runtime.messages import (
    Run,
    RunResult,
    StepPlan,
    StepResult,
    TokenLogprob,
    WorkerRequest,
)
from radixrt.runtime.models.loader import LoadedModel
from radixrt.runtime.models.pooler import PoolState, pool_runs
from radixrt.runtime.pooling_params import pack_floats
from radixrt.runtime.sampling_params import SamplingParams
from radixrt.runtime.worker.draft_verifier import (
    accepted_path,
    batch_entries,
    kept_slots,
    run_parents,
    segments,
)
from radixrt.runtime.worker.grammar_rows import MaskRow, MaskThread, after_sample
from radixrt.runtime.worker.image_embeds import ImageEmbedder, ImageEntry, image_token_id
from radixrt.runtime.worker.kv_tiers import KVTiers
from radixrt.runtime.worker.lora_manager import LoraManager
from radixrt.runtime.worker.request_state import RequestState
from radixrt.runtime.worker.sampler import (
    AllowedTokens,
    Sampler,
    SamplingRow,
    TokenSpan,
    prompt_logprobs,
)
from radixrt.runtime.worker.step_rows import Draws, LogitRows


class Worker:
    def __init__(
        self,
        loaded: LoadedModel,
        num_slots: int,
        seed: int = 0,
        cuda_graph_max_bs: int = 0,
        grammars: GrammarCompiler | None = None,
        jump_forward: bool = True,
        grammar_dir: str | None = None,
        grammar_backend: str = DEFAULT_GRAMMAR_BACKEND,
        grammar_compile_timeout: float = DEFAULT_GRAMMAR_COMPILE_TIMEOUT_S,
    ) -> None:
        """grammars: where constrained requests' compiled grammars come from (the Engine shares
        its compiler); if None, one is made on first use, reading the grammars the tokenizer
        process left in grammar_dir. jump_forward: append the tokens a grammar forces without
        sampling them. grammar_backend: the engines of the compiler made here."""
        self.model = loaded.model
        self.config = loaded.config
        param = next(self.model.parameters())
        self.device = param.device
        self.dtype = param.dtype
        kv_shape = self.model.shard.kv_shape(loaded.config)  # this rank's KV heads
        self.kv_cache = KVCache.from_config(kv_shape, num_slots, self.dtype, self.device)
        eos = list(loaded.config.eos_token_ids)
        self.sampler = Sampler(loaded.config.vocab_size, eos, self.device, base_seed=seed,
                               native=loaded.model.cpu_kernels)
        self.states: dict[int, RequestState] = {}
        self.swapped: dict[int, torch.Tensor] = {}  # rid -> host K/V
        self.tiers: KVTiers | None = None  # the KV tiers below the pool (setup.build_tiers)
        self.tokenizer = loaded.tokenizer
        self.processor = loaded.processor  # a vision-language model's (the request front's)
        self.grammars = grammars
        self.grammar_dir = grammar_dir
        self.grammar_backend = grammar_backend
        self.grammar_compile_timeout = grammar_compile_timeout
        self.jump_forward = jump_forward
        # grammar masks beside the forward pass where it runs on an accelerator
        self.masks = MaskThread(loaded.config.vocab_size, threaded=self.device.type != "cpu")
        self.lora: LoraManager | None = None  # LoRA adapters' slots (setup.build_worker)
        self.images = (None if loaded.vision is None  # a vision-language model's images
                       else ImageEmbedder(loaded.vision, self.device, self.dtype,
                                          image_token_id(loaded.tokenizer, loaded.processor),
                                          mrope=bool(loaded.config.mrope_section)))
        self.graph_runner = None  # decode steps from CUDA graphs (triton backend on CUDA only)
        if cuda_graph_max_bs > 0 and self.device.type == "cuda":
            from radixrt.runtime.worker.cuda_graph import CudaGraphRunner, supports_cuda_graphs

            if supports_cuda_graphs(self.model, self.device):
                self.graph_runner = CudaGraphRunner(self.model, self.kv_cache, cuda_graph_max_bs)

    def close(self) -> None:
        """Stop the mask thread (if a constrained step started it); close the disk tier."""
        self.masks.close()
        if self.tiers is not None:
            self.tiers.close()

    # --- plan execution ------------------------------------------------------------------
    @torch.inference_mode()
    def execute(self, plan: StepPlan) -> StepResult:
        for swap in plan.swap_out:
            slots = torch.tensor(swap.slots, dtype=torch.int64)
            self.swapped[swap.rid] = self.kv_cache.read_slots(slots)
            self.states[swap.rid].slots = []
        moved = 0.0
        if plan.moves:
            if self.tiers is None:
                raise RuntimeError("a plan moves KV pages between tiers, but this worker has none")
            self.tiers.apply(plan.moves)
            moved = self.tiers.take_seconds()
        if plan.flush_disk and self.tiers is not None:
            self.tiers.flush()
        for rid in plan.free:
            self.states.pop(rid, None)
            self.swapped.pop(rid, None)
        if plan.lora_loads or plan.lora_unloads:
            if self.lora is None:
                raise RuntimeError("a plan names LoRA adapters, but this worker serves none")
            self.lora.register(plan.lora_loads)
            self.lora.forget(plan.lora_unloads)
        for new in plan.new_requests:
            self.states[new.rid] = self._new_state(new)
        for copy in plan.copies:
            if copy.src != copy.dst:  # equal: only re-point the table (onto shared pages)
                self.kv_cache.copy_slots(torch.tensor(copy.src), torch.tensor(copy.dst))
            table = self.states[copy.rid].slots
            table[copy.start : copy.start + len(copy.dst)] = copy.dst
        for swap in plan.swap_in:
            data = self.swapped.pop(swap.rid)
            self.kv_cache.write_slots(torch.tensor(swap.slots, dtype=torch.int64), data)
            self.states[swap.rid].slots = list(swap.slots)
        if not plan.runs:
            return StepResult(step_id=plan.step_id, move_seconds=moved)
        images = self.images
        before = images.counts() if images is not None else (0, 0, 0.0)
        result = self._forward(plan)
        extra = {**(images.since(before) if images is not None else {}),
                 **({"move_seconds": moved} if moved else {})}
        return msgspec.structs.replace(result, **extra) if extra else result

    def _new_state(self, new: WorkerRequest) -> RequestState:
        params = new.params
        grammar = None
        if params.constraint is not None:  # re-admitted after preemption: replay its outputs
            grammar = GrammarState.replay(self._grammar(params), list(new.output_ids))
        return RequestState(
            params=params,
            max_tokens=new.max_tokens,
            token_ids=(list(new.prompt_ids) if self.images is None or not new.images
                       else self.images.shown(new.prompt_ids)) + list(new.output_ids),
            prompt_len=len(new.prompt_ids),
            slots=list(new.prefix_slots),
            seed_offset=new.seed_offset,
            grammar=grammar,
            lora=new.lora,
            pool=None if params.pooling is None else PoolState(params.pooling),
            images=new.images or None,
        )

    def _grammar(self, params: SamplingParams) -> Grammar:
        constraint = params.constraint
        assert constraint is not None
        if self.grammars is None:
            table = TokenTable(self.tokenizer, self.config.vocab_size, self.config.eos_token_ids)
            self.grammars = GrammarCompiler(table, self.grammar_dir, backend=self.grammar_backend,
                                            timeout_s=self.grammar_compile_timeout,
                                            check_inline=False)
        return self.grammars.load(self.grammars.key(constraint), constraint)

    def _forward(self, plan: StepPlan) -> StepResult:
        tokens: list[list[int]] = []
        prefix_lens: list[int] = []
        tables: list[list[int]] = []
        entry: dict[int, int] = {}  # rid -> its (first) batch entry
        adapters: list[str | None] = []  # each entry's LoRA adapter
        images: list[ImageEntry] = []  # each entry's images and positions
        for run in plan.runs:
            state = self.states[run.rid]
            if len(state.slots) != run.start:
                raise RuntimeError(
                    f"request {run.rid}: slot table has {len(state.slots)} positions, "
                    f"the plan starts at {run.start}"
                )
            state.slots.extend(run.new_slots)
            entry[run.rid] = len(tokens)
            for ids, prefix_len, table in batch_entries(run, state.token_ids, state.slots):
                tokens.append(ids)
                prefix_lens.append(prefix_len)
                tables.append(table)
                adapters.append(state.lora)
                images.append((state.images or (), prefix_len, len(ids)))
        batch = ForwardBatch.build(tokens, prefix_lens, tables, device=self.device,
                                   prefix_groups=self._prefix_groups(plan, entry))
        if self.images is not None:
            self.images.place(batch, images)
        if self.lora is not None:
            batch.lora = self.lora.batch(adapters, batch.extend_lens, self.device)
        elif any(adapters):
            raise RuntimeError("a request names a LoRA adapter, but this worker serves none")
        wanted = self._logit_rows(plan.runs, batch)
        draws = self._draws(wanted)
        pending = self.masks.start(draws.grammars)  # built while the forward pass runs
        results: list[RunResult] = []
        allowed, timing = None, None
        try:
            hidden = (None if self.graph_runner is None or batch.image_rows is not None
                      or batch.mrope_positions is not None else self.graph_runner.run(batch))
            if hidden is None:
                hidden = self.model(batch, self.kv_cache)  # [num_tokens, hidden_size]
            pooled = self._pool(plan.runs, hidden)  # before sampling: a fork drops its parent
            if wanted.rows:
                index = torch.tensor(wanted.rows, dtype=torch.int64, device=self.device)
                logits = self.model.compute_logits(hidden[index])  # [len(rows), vocab] float32
                prompt = self._prompt_logprobs(logits, wanted)
                if pending is not None:
                    waiting, pending = pending, None
                    allowed, timing = waiting.result(self.device)
                results = self._sample(logits, wanted, prompt, draws, allowed)
            results += pooled
        finally:
            if pending is not None:  # the pass failed: the grammars are the mask thread's
                pending.wait()  # until it is done with them
        return StepResult(step_id=plan.step_id, results=results, num_tokens=batch.num_tokens,
                          masks=timing)

    def _pool(self, runs: list[Run], hidden: torch.Tensor) -> list[RunResult]:
        """Pooling requests (models/pooler.py): a run that ends its prompt returns its output."""
        states = [self.states[run.rid] for run in runs]
        outs = pool_runs(self.model, hidden, [
            (s.pool, run.start, run.num_new, run.start + run.num_new == len(s.token_ids))
            for run, s in zip(runs, states)])
        return [RunResult(rid=run.rid, pooled=pack_floats(out.tolist()))
                for run, out in zip(runs, outs) if out is not None]

    def _prefix_groups(self, plan: StepPlan, index: dict[int, int]) -> list[PrefixGroup]:
        """The plan's prefix groups as batch indices (`index`: rid -> batch entry), each checked
        against the slot tables (a group whose members' tables differ would read another
        request's KV)."""
        groups = []
        for group in plan.prefix_groups:
            tables = [self.states[rid].slots for rid in group.rids]
            head = tables[0][: group.length]
            if any(t[: group.length] != head for t in tables[1:]):
                raise RuntimeError(f"prefix group {group.rids}: slot tables differ within its "
                                   f"first {group.length} positions")
            groups.append(PrefixGroup([index[rid] for rid in group.rids], group.length))
        return groups

    def _logit_rows(self, runs: list[Run], batch: ForwardBatch) -> LogitRows:
        wanted = LogitRows(rows=[], sample=[], prompt=[])
        offset = 0
        for run in runs:
            state = self.states[run.rid]
            if run.prompt_logprob_from >= 0:
                # row at position p predicts the token at p + 1; prompt tokens only
                first = max(run.start, run.prompt_logprob_from - 1)
                last = min(run.start + run.num_new, state.prompt_len - 1)
                if last > first:
                    wanted.prompt.append((len(wanted.rows), last - first, run))
                    wanted.rows.extend(range(offset + first - run.start, offset + last - run.start))
            if run.sample:  # the last known token's row, and each drafted token's
                wanted.sample.append((len(wanted.rows), run))
                end = offset + run.num_new
                wanted.rows.extend(range(end - 1 - len(run.draft), end))
            offset += run.num_new
        return wanted

    def _prompt_logprobs(self, logits: torch.Tensor, wanted: LogitRows) -> dict[int, list]:
        out: dict[int, list[TokenLogprob]] = {}
        for first, count, run in wanted.prompt:
            state = self.states[run.rid]
            start_pos = max(run.start, run.prompt_logprob_from - 1)
            targets = state.token_ids[start_pos + 1 : start_pos + 1 + count]
            target_t = torch.tensor(targets, dtype=torch.int64, device=self.device)
            lps, tops = prompt_logprobs(
                logits[first : first + count], target_t, state.params.top_logprobs
            )
            out[run.rid] = [
                TokenLogprob(token_id=t, logprob=lp, top=top)
                for t, lp, top in zip(targets, lps, tops)
            ]
        return out

    def _draws(self, wanted: LogitRows) -> Draws:
        """The rows the step samples (a fork's children each draw one), known before the forward
        pass runs, so their grammar masks can be built beside it."""
        draws = Draws(row_index=[], rows=[], owners=[], grammars=[], known={}, drafted={})
        for idx, run in wanted.sample:
            state = self.states[run.rid]
            end = run.known_end
            if not run.fork_into and end < len(state.token_ids):
                draws.known[run.rid] = (idx, state.token_ids[end])  # jump-forward appended it
                continue
            if run.draft:
                self._draft_rows(draws, idx, run, state)
                continue
            for i, child in enumerate(run.fork_into or [run.rid]):
                known_len = len(state.token_ids)
                draws.rows.append(
                    SamplingRow(
                        params=state.params,  # a fork's n does not change how a row samples
                        prompt_ids=TokenSpan(state.token_ids, 0, state.prompt_len),
                        output_ids=TokenSpan(state.token_ids, state.prompt_len, known_len),
                        seed_offset=i if run.fork_into else state.seed_offset,
                    )
                )
                draws.row_index.append(idx)
                draws.owners.append(child)
                grammar = state.grammar
                if grammar is not None and run.fork_into:  # each sample walks its own copy
                    grammar = GrammarState.replay(grammar.grammar,
                                                    state.token_ids[state.prompt_len :])
                draws.grammars.append(None if grammar is None else MaskRow(grammar))
        if all(g is None for g in draws.grammars):
            draws.grammars = []
        return draws

    @staticmethod
    def _draft_rows(draws: Draws, idx: int, run: Run, state: RequestState) -> None:
        """Speculative decoding: one row after the last known token and one after each drafted
        node, each sampled as if the node's path were outputs (worker/draft_verifier.py)."""
        if run.fork_into:
            raise RuntimeError(f"request {run.rid}: a draft on a run that forks")
        draws.drafted[run.rid] = len(draws.rows)
        known = len(state.token_ids)
        rows: list[tuple[list[int], int]] = [(state.token_ids, known)]  # (tokens, their end)
        for above, nodes in segments(run_parents(run)):  # the penalties read the path before a row
            tokens = state.token_ids + [run.draft[i] for i in above + nodes]
            rows += [(tokens, known + len(above) + m + 1) for m in range(len(nodes))]
        for j, (tokens, end) in enumerate(rows):
            draws.rows.append(SamplingRow(
                params=state.params,
                prompt_ids=TokenSpan(tokens, 0, state.prompt_len),
                output_ids=TokenSpan(tokens, state.prompt_len, end),
                seed_offset=state.seed_offset,
            ))
            draws.row_index.append(idx + j)
            draws.owners.append(run.rid)
            grammar = state.grammar
            draws.grammars.append(None if grammar is None
                                  else MaskRow(grammar, tuple(tokens[known:end])))

    def _sample(self, logits: torch.Tensor, wanted: LogitRows, prompt: dict, draws: Draws,
                allowed: AllowedTokens | None) -> list[RunResult]:
        rows, owners, known = draws.rows, draws.owners, draws.known
        sampled: dict[int, TokenLogprob] = {}
        child_grammars: dict[int, GrammarState | None] = {}
        drawn: list[TokenLogprob] = []
        if rows:
            picked = (logits if draws.row_index == list(range(len(logits)))
                      else logits[torch.tensor(draws.row_index, device=self.device)])
            out = self.sampler.sample(picked, rows, allowed)
            for j, rid in enumerate(owners):
                top = out.top_logprobs[j] if out.top_logprobs else []
                drawn.append(TokenLogprob(out.token_ids[j], out.logprobs[j], top))
                if rid in draws.drafted:
                    continue
                sampled[rid] = drawn[j]
                row = draws.grammars[j] if draws.grammars else None
                child_grammars[rid] = None if row is None else row.state
        if known:
            rids = list(known)
            params = [self.states[rid].params for rid in rids]
            picked = logits[torch.tensor([known[r][0] for r in rids], device=self.device)]
            out = self.sampler.score(picked, [known[r][1] for r in rids], params)
            for j, rid in enumerate(rids):
                top = out.top_logprobs[j] if out.top_logprobs else []
                sampled[rid] = TokenLogprob(out.token_ids[j], out.logprobs[j], top)
        results: list[RunResult] = []
        for _, run in wanted.sample:
            if run.fork_into:
                self._fork(run, sampled, child_grammars)
                results += [RunResult(rid=c, token=sampled[c], forced=self._advance(c))
                            for c in run.fork_into]
                results.append(RunResult(rid=run.rid, prompt_logprobs=prompt.get(run.rid, [])))
                continue
            if run.draft:
                first = draws.drafted[run.rid]
                results.append(self._verify(run, drawn[first : first + len(run.draft) + 1]))
                continue
            forced: list[int] = []
            if run.rid not in known:
                self.states[run.rid].token_ids.append(sampled[run.rid].token_id)
                forced = self._advance(run.rid)
            lps = prompt.get(run.rid, [])
            results.append(RunResult(rid=run.rid, token=sampled[run.rid], prompt_logprobs=lps,
                                     forced=forced))
        sampled_rids = {run.rid for _, run in wanted.sample}
        for rid, lps in prompt.items():
            if rid not in sampled_rids:
                results.append(RunResult(rid=rid, prompt_logprobs=lps))
        return results

    def _verify(self, run: Run, drawn: list[TokenLogprob]) -> RunResult:
        """Keep the drafts verification accepts (worker/draft_verifier.py), then the token sampled
        after them; the rejected drafts' slots are dropped from the slot table."""
        state = self.states[run.rid]
        stops = set(state.params.stop_token_ids)  # what ends the output (ignore_eos: not EOS)
        if not state.params.ignore_eos:
            stops |= set(self.sampler.eos_token_ids)
        grammar = state.grammar

        def goes_on(token: int) -> bool:  # the grammar moves on; jump-forward takes over?
            assert grammar is not None
            grammar.advance(token)
            if self.jump_forward and grammar.forced():
                grammar.rollback(1)  # after_sample advances past it as the sampled token
                return False
            return True

        nodes = accepted_path(run.draft, run_parents(run), [t.token_id for t in drawn], stops,
                              None if grammar is None else goes_on)
        end = run.known_end
        moves = kept_slots(nodes)
        if moves:  # the accepted branch's K/V goes where a chain's would be
            slots = state.slots
            self.kv_cache.copy_slots(torch.tensor([slots[end + a] for a, _ in moves]),
                                     torch.tensor([slots[end + b] for _, b in moves]))
        del state.slots[end + len(nodes) :]
        emitted = [drawn[0]] + [drawn[i + 1] for i in nodes]  # the sample at each place reached
        state.token_ids.extend(t.token_id for t in emitted)
        return RunResult(rid=run.rid, token=emitted[-1], accepted=emitted[:-1],
                         forced=self._advance(run.rid))

    def _advance(self, rid: int) -> list[int]:
        """After a request's token is appended: move its grammar on; jump-forward's tokens."""
        state = self.states[rid]
        return after_sample(state.grammar, state.token_ids, state.prompt_len,
                            state.max_tokens, self.jump_forward)

    def _fork(self, run: Run, sampled: dict[int, TokenLogprob],
              grammars: dict[int, GrammarState | None]) -> None:
        parent = self.states.pop(run.rid)
        for i, child in enumerate(run.fork_into):
            self.states[child] = RequestState(
                params=parent.params,
                max_tokens=parent.max_tokens,
                token_ids=parent.token_ids + [sampled[child].token_id],
                prompt_len=parent.prompt_len,
                slots=list(parent.slots),
                seed_offset=i,
                grammar=grammars.get(child),
                lora=parent.lora,  # the samples of a prompt run under its adapter
                images=parent.images,  # multimodal RoPE's positions need them
            )
