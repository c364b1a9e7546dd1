"""The outlines-core engine's own parts: the store folder that hands compiled indexes from the
tokenizer process to the worker, and the kinds it leaves to llguidance. (Its grammars' masks,
forced tokens and end marker: test_grammar.py and test_structural.py.)"""

from __future__ import annotations

from typing import Any

import pytest
from test_grammar import END, MERGES, TOKENS, VOCAB_SIZE, T, bpe_tokenizer, mask_of, walk

from radixrt.runtime.constrained.compiler import GrammarCompiler
from radixrt.runtime.constrained.outlines_engine import OutlinesEngine
from radixrt.runtime.constrained.outlines_regex import to_regex
from radixrt.runtime.constrained.token_table import TokenTable


@pytest.fixture(scope="module")
def table() -> TokenTable:
    return TokenTable(bpe_tokenizer(TOKENS, MERGES), VOCAB_SIZE, [END])


def test_the_store_dir_hands_compiled_indexes_to_another_process(
        table: TokenTable, tmp_path: Any) -> None:
    maker = GrammarCompiler(table, backend="outlines", store_dir=tmp_path)  # tokenizer process
    loader = GrammarCompiler(table, backend="outlines", store_dir=tmp_path)  # the worker
    try:
        constraint = ("regex", "(ab|cd)x{2}")
        made = maker.get(constraint)
        assert (tmp_path / f"{made.key}.index").exists()
        loaded = loader.load(made.key, constraint)
        assert loader.compiled == 0  # read from the file, not compiled
        assert loaded.key == made.key and loader.load(made.key, constraint) is loaded
        for tokens in [(), T("ab"), T("cd", "x")]:
            assert walk(loaded, tokens).forced() == walk(made, tokens).forced()
            assert mask_of(walk(loaded, tokens)) == mask_of(walk(made, tokens))
        fresh = ("regex", "abc")
        assert loader.load(loader.key(fresh), fresh).key == loader.key(fresh)
        assert loader.compiled == 1  # no file for it: compiled here
    finally:
        maker.close()
        loader.close()


@pytest.mark.parametrize("kind", ["ebnf", "lark"])
def test_context_free_grammars_are_left_to_llguidance(table: TokenTable, kind: str) -> None:
    with pytest.raises(ValueError, match=f"{kind} grammars need the llguidance engine"):
        OutlinesEngine(table, processes=1).check((kind, "start: \"a\""), timeout_s=60)
    with pytest.raises(ValueError, match="unknown constraint kind 'gbnf'"):
        to_regex(("gbnf", "x"))
