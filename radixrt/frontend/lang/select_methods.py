"""How `select` turns each choice's token log-probabilities into a decision."""

from __future__ import annotations

from dataclasses import dataclass

from radixrt.frontend.lang.backend import ChoiceLogprobs

METHODS = ("token_length_normalized", "greedy", "unconditional_likelihood_normalized")


@dataclass(frozen=True)
class SelectMethod:
    """A select method as an object (SGLang's `choices_method=sgl.greedy_token_selection`)."""

    name: str


token_length_normalized = SelectMethod("token_length_normalized")
greedy_token_selection = SelectMethod("greedy")
unconditional_likelihood_normalized = SelectMethod("unconditional_likelihood_normalized")


def method_name(method: str | SelectMethod) -> str:
    """The method's name, from a name or a SelectMethod; ValueError for anything else."""
    name = method.name if isinstance(method, SelectMethod) else method
    if name not in METHODS:
        raise ValueError(f"select method {method!r} is unknown: use one of {METHODS} (or "
                         "SGLang's token_length_normalized, greedy_token_selection, "
                         "unconditional_likelihood_normalized objects)")
    return name


def choice_scores(method: str, scored: list[ChoiceLogprobs]) -> list[float]:
    """One number per choice, higher is better (ties go to the earlier choice).

    token_length_normalized: mean log-probability of the choice's tokens.
    unconditional_likelihood_normalized: (sum of log-probabilities given the text - sum given only
      a start token) / the choice's token count, so a choice that is likely anywhere gains nothing.
    greedy: the first token's log-probability (ties are broken by the next tokens, see `pick`).
    """
    if method == "token_length_normalized":
        return [sum(c.logprobs) / len(c.logprobs) for c in scored]
    if method == "unconditional_likelihood_normalized":
        return [(sum(c.logprobs) - sum(c.unconditional)) / len(c.logprobs) for c in scored]
    if method == "greedy":
        return [c.logprobs[0] for c in scored]
    raise ValueError(f"unknown select method {method!r}")


def pick(method: str, scored: list[ChoiceLogprobs]) -> tuple[int, list[float]]:
    """Index of the chosen choice and every choice's score."""
    scores = choice_scores(method, scored)
    if method == "greedy":  # compare token by token: the first token, then the second, ...
        best = max(range(len(scored)), key=lambda i: (scored[i].logprobs, -i))
    else:
        best = max(range(len(scores)), key=lambda i: (scores[i], -i))
    return best, scores
