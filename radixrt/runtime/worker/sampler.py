"""Vectorised sampling: one call per step turns the batch's logits into next tokens and logprobs.

Per row, in this order: logit_bias -> repetition_penalty (HF-style, over prompt + output tokens)
-> frequency / presence penalties (OpenAI-style, over output tokens) -> min_tokens masking (EOS and
stop_token_ids at -inf while the output is shorter than min_tokens) -> the grammar's allowed-token
mask (constrained rows only) -> greedy rows take the argmax -> temperature -> top_k -> top_p ->
min_p -> sample.

Every stage works on the whole batch at once with per-row parameter tensors; a stage that no row
uses is skipped, and rows that do not use a stage keep their logits bit for bit.

Sampling uses the exponential race (equivalent to Gumbel-max): with q ~ Exponential(1) per vocab
entry, argmax(probs / q) is distributed as probs. The noise of a row whose params carry a seed comes
from a generator seeded by (seed, seed_offset, output_index) only, so that row's token does not
depend on the batch it runs in nor on the step. Unseeded rows share the sampler's own generator.
The same seed gives the same tokens on the same device type (CPU and CUDA generators differ).

Logprobs are those of the model: log_softmax of the RAW logits passed in, before any processing,
so they describe the model's distribution, not the processed one that was sampled from.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from radixrt.kernels.cpu_norm import argmax_lse_cpu
from radixrt.runtime.sampling_params import SamplingParams

# Positive temperatures below this are clamped to it in the sampler (logits / t must stay finite).
MIN_SAMPLING_TEMPERATURE = 1e-5

_MASK64 = (1 << 64) - 1
AllowedTokens = tuple[list[int], torch.Tensor]  # (rows, [len(rows), vocab] bool allowed tokens)


class TokenSpan(Sequence[int]):
    """tokens[start:stop] without copying them: a row's prompt and output are spans of its
    request's token list, so a step costs nothing per token of context unless a penalty reads
    them (the list only grows past stop; earlier entries never change)."""

    __slots__ = ("_tokens", "_start", "_stop")

    def __init__(self, tokens: list[int], start: int, stop: int) -> None:
        self._tokens, self._start, self._stop = tokens, start, stop

    def __len__(self) -> int:
        return self._stop - self._start

    def __getitem__(self, index):  # type: ignore[no-untyped-def, override]
        if isinstance(index, slice):
            return [self._tokens[i] for i in range(self._start, self._stop)[index]]
        return self._tokens[range(self._start, self._stop)[index]]

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self._tokens[self._start : self._stop])


@dataclass
class SamplingRow:
    """What the sampler needs to know about one row of the batch."""

    params: SamplingParams
    prompt_ids: Sequence[int] = ()  # only read when repetition_penalty != 1
    output_ids: Sequence[int] = ()  # tokens generated so far (penalties, min_tokens)
    seed_offset: int = 0  # for sample i of a request with n samples: i
    output_index: int | None = None  # position being sampled in the output; None = len(output_ids)

    def __post_init__(self) -> None:
        if self.output_index is None:
            self.output_index = len(self.output_ids)


@dataclass
class SampleOutput:
    token_ids: list[int]  # [bs]
    logprobs: list[float]  # [bs] log_softmax(raw logits)[row, token_ids[row]]
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)  # [bs][k_row]


def _mix64(x: int) -> int:
    """splitmix64 finaliser: a cheap, well-spread 64-bit hash of x."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def row_seed(seed: int, seed_offset: int, output_index: int) -> int:
    """Generator seed for one seeded row: a function of these three numbers only."""
    h = _mix64(seed & _MASK64)
    h = _mix64(h ^ (seed_offset & _MASK64))
    h = _mix64(h ^ (output_index & _MASK64))
    return h >> 1  # 63 bits: valid for torch.Generator.manual_seed on every device


def _pad(seqs: Sequence[Sequence[int]], pad: int, device: torch.device) -> torch.Tensor:
    width = max((len(s) for s in seqs), default=0)
    rows = [list(s) + [pad] * (width - len(s)) for s in seqs]
    return torch.tensor(rows, dtype=torch.int64, device=device).reshape(len(seqs), width)


class Sampler:
    def __init__(self, vocab_size: int, eos_token_ids: Sequence[int], device: torch.device | str,
                 base_seed: int = 0, native: bool = False) -> None:
        """native: greedy rows' argmax and every row's log-sum-exp on the CPU kernel
        (kernels/cpu_norm.py argmax_lse_cpu: torch's argmax reads a 49k vocabulary at a
        fraction of the memory's speed)."""
        self.vocab_size = vocab_size
        self.eos_token_ids = tuple(int(t) for t in eos_token_ids)
        self.device = torch.device(device)
        self.native = native
        self._generator = torch.Generator(device=self.device).manual_seed(base_seed)
        self._seeded_generator = torch.Generator(device=self.device)  # re-seeded for each row

    # --- public ------------------------------------------------------------------------------

    def sample(self, logits: torch.Tensor, rows: Sequence[SamplingRow],
               allowed: AllowedTokens | None = None) -> SampleOutput:
        """logits: [bs, vocab] float32 (one row per entry of rows) -> one token per row.
        allowed: (row indices, [len(indices), vocab] bool) for the rows a grammar constrains."""
        bs = len(rows)
        if logits.dim() != 2 or logits.shape[0] != bs or logits.shape[1] != self.vocab_size:
            raise ValueError(f"logits shape {tuple(logits.shape)} does not match "
                             f"[{bs}, vocab_size={self.vocab_size}]")
        raw = logits.float()  # [bs, vocab]
        if bs == 0:
            return SampleOutput([], [], [])
        params = [row.params for row in rows]
        x = self._process(raw, rows)  # [bs, vocab]
        if allowed is not None:
            x = self._apply_allowed(x if x is not raw else raw.clone(), allowed)
        greedy = [i for i, p in enumerate(params) if p.is_greedy]
        random = [i for i, p in enumerate(params) if not p.is_greedy]
        if self.native and x is raw and not random:  # one pass gives tokens and lse
            found = argmax_lse_cpu(raw.contiguous())
            if found is not None:
                return self._logprobs(raw, found[0], params, found[1])
        tokens = torch.empty(bs, dtype=torch.int64, device=raw.device)  # [bs]
        if greedy:
            g = self._index(greedy)
            tokens[g] = self._argmax(x if len(greedy) == bs else x[g])
        if random:
            r = self._index(random)
            probs = self._probs([params[i] for i in random], x[r])  # [n_random, vocab]
            tokens[r] = self._race(probs, [rows[i] for i in random])
        return self._logprobs(raw, tokens, params)

    def _argmax(self, x: torch.Tensor) -> torch.Tensor:
        """[m, vocab] -> [m] each row's first maximum."""
        found = argmax_lse_cpu(x.contiguous()) if self.native else None
        return x.argmax(dim=-1) if found is None else found[0]

    # --- logits processing -------------------------------------------------------------------

    def _index(self, rows: list[int]) -> torch.Tensor:
        return torch.tensor(rows, dtype=torch.int64, device=self.device)

    def _process(self, raw: torch.Tensor, rows: Sequence[SamplingRow]) -> torch.Tensor:
        """Bias, penalties and min_tokens masking. Returns raw itself when no row needs any."""
        x = raw
        params = [row.params for row in rows]
        if any(p.logit_bias for p in params):
            x = x.clone()
            self._apply_logit_bias(x, params)
        rep = [i for i, p in enumerate(params) if p.repetition_penalty != 1.0]
        if rep:
            x = x.clone() if x is raw else x
            self._apply_repetition(x, rows, rep)
        pen = [i for i, p in enumerate(params)
               if p.frequency_penalty != 0.0 or p.presence_penalty != 0.0]
        if pen:
            x = x.clone() if x is raw else x
            self._apply_frequency_presence(x, rows, pen)
        masked_rows: list[int] = []
        masked_ids: list[int] = []
        for i, row in enumerate(rows):
            if len(row.output_ids) < row.params.min_tokens:
                ids = set(row.params.stop_token_ids)
                if not row.params.ignore_eos:
                    ids.update(self.eos_token_ids)
                masked_ids.extend(ids)
                masked_rows.extend([i] * len(ids))
        if masked_rows:
            x = x.clone() if x is raw else x
            x[self._index(masked_rows), self._index(masked_ids)] = float("-inf")
        return x

    def _apply_allowed(self, x: torch.Tensor, allowed: AllowedTokens) -> torch.Tensor:
        sel, mask = allowed  # mask: [len(sel), vocab] bool
        index = self._index(sel)
        empty = ~mask.any(dim=-1)  # [len(sel)]: never leave a row with nothing: let it end
        if bool(empty.any()):
            mask = mask.clone()
            mask[empty.nonzero().flatten()[:, None], self._index(list(self.eos_token_ids))] = True
        x[index] = x[index].masked_fill(~mask, float("-inf"))
        return x

    def score(self, logits: torch.Tensor, tokens: Sequence[int],
              params: list[SamplingParams]) -> SampleOutput:
        """Logprobs (and top logprobs) of given tokens, for rows whose token is already known."""
        chosen = torch.tensor(list(tokens), dtype=torch.int64, device=logits.device)
        return self._logprobs(logits.float(), chosen, params)

    def _apply_logit_bias(self, x: torch.Tensor, params: list[SamplingParams]) -> None:
        r: list[int] = []
        t: list[int] = []
        v: list[float] = []
        for i, p in enumerate(params):
            for token_id, bias in (p.logit_bias or {}).items():
                r.append(i)
                t.append(token_id)
                v.append(bias)
        values = torch.tensor(v, dtype=x.dtype, device=x.device)  # [num_biases]
        x.index_put_((self._index(r), self._index(t)), values, accumulate=True)

    def _seen_mask(self, seqs: list[Sequence[int]]) -> torch.Tensor:
        """[m, vocab] bool: which tokens occur in each sequence (padding goes to a spare column)."""
        ids = _pad(seqs, self.vocab_size, self.device)  # [m, max_len]
        seen = torch.zeros(len(seqs), self.vocab_size + 1, dtype=torch.bool, device=self.device)
        seen.scatter_(1, ids, True)
        return seen[:, : self.vocab_size]

    def _counts(self, seqs: list[Sequence[int]]) -> torch.Tensor:
        """[m, vocab] float32: how often each token occurs in each sequence."""
        ids = _pad(seqs, self.vocab_size, self.device)  # [m, max_len]
        counts = torch.zeros(len(seqs), self.vocab_size + 1, dtype=torch.float32,
                             device=self.device)
        counts.scatter_add_(1, ids, torch.ones_like(ids, dtype=torch.float32))
        return counts[:, : self.vocab_size]

    def _apply_repetition(self, x: torch.Tensor, rows: Sequence[SamplingRow],
                          sel: list[int]) -> None:
        idx = self._index(sel)
        seen = self._seen_mask([list(rows[i].prompt_ids) + list(rows[i].output_ids) for i in sel])
        penalty = torch.tensor([rows[i].params.repetition_penalty for i in sel],
                               dtype=x.dtype, device=x.device)[:, None]  # [m, 1]
        sub = x[idx]  # [m, vocab]
        penalised = torch.where(sub > 0, sub / penalty, sub * penalty)
        x[idx] = torch.where(seen, penalised, sub)

    def _apply_frequency_presence(self, x: torch.Tensor, rows: Sequence[SamplingRow],
                                  sel: list[int]) -> None:
        idx = self._index(sel)
        counts = self._counts([rows[i].output_ids for i in sel])  # [m, vocab]
        freq = torch.tensor([rows[i].params.frequency_penalty for i in sel],
                            dtype=x.dtype, device=x.device)[:, None]  # [m, 1]
        pres = torch.tensor([rows[i].params.presence_penalty for i in sel],
                            dtype=x.dtype, device=x.device)[:, None]  # [m, 1]
        x[idx] = x[idx] - freq * counts - pres * (counts > 0).to(x.dtype)

    # --- sampling ----------------------------------------------------------------------------

    def _probs(self, params: list[SamplingParams], x: torch.Tensor) -> torch.Tensor:
        """x: [m, vocab] processed logits -> [m, vocab] probabilities after temperature,
        top_k, top_p and min_p."""
        m, vocab = x.shape
        temp = torch.tensor([max(p.temperature, MIN_SAMPLING_TEMPERATURE) for p in params],
                            dtype=x.dtype, device=x.device)[:, None]  # [m, 1]
        x = x / temp
        use_k = [0 < p.top_k < vocab for p in params]
        if any(use_k):  # keep logits >= the row's k-th largest (ties at the k-th all survive)
            k_max = max(p.top_k for p, u in zip(params, use_k, strict=True) if u)
            largest = x.topk(k_max, dim=-1).values  # [m, k_max], descending
            kth_index = torch.tensor([p.top_k - 1 if u else 0 for p, u in
                                      zip(params, use_k, strict=True)], device=x.device)
            kth = largest.gather(1, kth_index[:, None])  # [m, 1]
            off = ~torch.tensor(use_k, device=x.device)[:, None]  # [m, 1]
            x = x.masked_fill(x < kth.masked_fill(off, float("-inf")), float("-inf"))
        use_p = [p.top_p < 1.0 for p in params]
        if any(use_p):  # keep the smallest most-likely set whose mass reaches top_p
            sorted_x, order = x.sort(dim=-1, descending=True)  # [m, vocab]
            sorted_probs = sorted_x.softmax(dim=-1)  # [m, vocab]
            mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs  # [m, vocab]
            top_p = torch.tensor([p.top_p for p in params], dtype=x.dtype,
                                 device=x.device)[:, None]  # [m, 1]
            active = torch.tensor(use_p, device=x.device)[:, None]  # [m, 1]
            drop = (mass_before >= top_p) & active  # [m, vocab] sorted; the first always stays
            x = x.masked_fill(drop.scatter(1, order, drop), float("-inf"))
        probs = x.softmax(dim=-1)  # [m, vocab]
        if any(p.min_p > 0.0 for p in params):
            min_p = torch.tensor([p.min_p for p in params], dtype=x.dtype,
                                 device=x.device)[:, None]  # [m, 1]
            floor = min_p * probs.max(dim=-1, keepdim=True).values  # [m, 1]
            probs = probs.masked_fill(probs < floor, 0.0)
        return probs

    def _race(self, probs: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
        """probs: [m, vocab] (need not be normalised) -> [m] int64 sampled tokens."""
        q = torch.empty_like(probs)  # [m, vocab] ~ Exponential(1)
        unseeded = [i for i, row in enumerate(rows) if row.params.seed is None]
        if unseeded:
            noise = torch.empty(len(unseeded), probs.shape[1], dtype=probs.dtype,
                                device=probs.device)
            noise.exponential_(generator=self._generator)
            q[self._index(unseeded)] = noise
        for i, row in enumerate(rows):  # per-row generator call; the vocab work is in torch
            if row.params.seed is not None:
                assert row.output_index is not None
                self._seeded_generator.manual_seed(
                    row_seed(row.params.seed, row.seed_offset, row.output_index))
                q[i].exponential_(generator=self._seeded_generator)
        q.clamp_(min=torch.finfo(q.dtype).tiny)
        return (probs / q).argmax(dim=-1)

    # --- logprobs ----------------------------------------------------------------------------

    def _logprobs(self, raw: torch.Tensor, tokens: torch.Tensor,
                  params: list[SamplingParams], lse: torch.Tensor | None = None) -> SampleOutput:
        if lse is None:
            found = argmax_lse_cpu(raw.contiguous()) if self.native else None
            lse = raw.logsumexp(dim=-1) if found is None else found[1]  # [bs]
        chosen = raw.gather(1, tokens[:, None]).squeeze(1) - lse  # [bs]
        top: list[list[tuple[int, float]]] = [[] for _ in params]
        want = [i for i, p in enumerate(params) if p.top_logprobs > 0]
        if want:
            idx = self._index(want)
            k = max(params[i].top_logprobs for i in want)
            values, ids = raw[idx].topk(k, dim=-1)  # [n_want, k], sorted descending
            values = values - lse[idx][:, None]
            for j, (vs, ts) in enumerate(zip(values.tolist(), ids.tolist(), strict=True)):
                kk = params[want[j]].top_logprobs
                top[want[j]] = list(zip(ts[:kk], vs[:kk], strict=True))
        return SampleOutput(tokens.tolist(), chosen.tolist(), top)


def prompt_logprobs(logits: torch.Tensor, target_ids: torch.Tensor | Sequence[int],
                    top_k: int) -> tuple[list[float], list[list[tuple[int, float]]]]:
    """logits: [n, vocab] at n prompt positions; target_ids: [n] the token that follows each.

    Returns the log_softmax of each target and, when top_k > 0, the top_k (token, logprob) pairs
    per position, highest first (empty lists when top_k == 0).
    """
    logp = logits.float().log_softmax(dim=-1)  # [n, vocab]
    targets = torch.as_tensor(target_ids, dtype=torch.int64, device=logits.device)  # [n]
    chosen = logp.gather(1, targets[:, None]).squeeze(1).tolist()
    if top_k <= 0:
        return chosen, [[] for _ in chosen]
    values, ids = logp.topk(min(top_k, logp.shape[1]), dim=-1)  # [n, k]
    return chosen, [list(zip(t, v, strict=True))
                    for t, v in zip(ids.tolist(), values.tolist(), strict=True)]
