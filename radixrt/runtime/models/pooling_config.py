"""What a checkpoint says about pooling: its sentence-transformers files (`modules.json`, the
Pooling module's `config.json`, a Normalize module), its classification head, and `--task`.

    modules.json        [{"idx": 0, "path": "", "type": "...Transformer"},
                         {"idx": 1, "path": "1_Pooling", "type": "...Pooling"},
                         {"idx": 2, "path": "2_Normalize", "type": "...Normalize"}]
    1_Pooling/config.json  {"pooling_mode": "lasttoken"}  (or sentence-transformers' older
                           booleans: {"pooling_mode_lasttoken": true, ...})

Served poolings: the last token, the mean of the tokens, the first token (CLS); a Normalize
module makes embeddings unit length. Modules that change the vector further (Dense, a
weighted mean, max pooling) are refused with their name: the embeddings would differ from the
checkpoint's. Without these files a model embeds by its last token, normalized (as decoder
embedders -- Qwen3-Embedding, gte-Qwen2 -- do).

Tasks (`--task`): "auto" reads the checkpoint (a classification head with one label: "reward",
several: "classify"; sentence-transformers files: "embed"; else "generate"); "rerank" on a
language model scores a document by P("yes") against P("no") at the last token (Qwen3-Reranker's
form), on a classifier of one label by the head's sigmoid (a cross-encoder).
"""

from __future__ import annotations

import json
import os
from typing import Any

from radixrt.runtime.models.model_config import ModelConfig
from radixrt.runtime.pooling_params import MODEL_TASKS, PoolingInfo

RERANK_WORDS = ("no", "yes")  # an LM reranker's labels: P(yes) against P(no)
RERANK_SYSTEM = ('Judge whether the Document meets the requirements based on the Query and the '
                 'Instruct provided. Note that the answer can only be "yes" or "no".')
DEFAULT_RERANK_INSTRUCTION = ("Given a web search query, retrieve relevant passages that "
                              "answer the query")
_ST_MODES = {"lasttoken": "last", "mean": "mean", "cls": "cls"}
_ST_FLAGS = {"pooling_mode_lasttoken": "lasttoken", "pooling_mode_mean_tokens": "mean",
             "pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max",
             "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
             "pooling_mode_weightedmean_tokens": "weightedmean"}
_ST_PASSIVE = ("Transformer", "Pooling", "Normalize", "Dropout")
# a GGUF file's `{arch}.pooling_type` (llama.cpp's enum): 1 mean, 2 CLS, 3 last; llama.cpp
# normalizes embeddings by default. 0 (none) and 4 (rank: a BERT reranker's head) say nothing
# this decoder serves: the last token then, as without the key
_GGUF_MODES = {1: "mean", 2: "cls", 3: "last"}


def read_pooling_info(folder: str | None, config: ModelConfig, task: str, tokenizer: Any,
                      generates: bool, gguf_pooling: int | None = None) -> PoolingInfo:
    """The model's PoolingInfo (folder: a safetensors checkpoint's, None for a GGUF file, whose
    `pooling_type` is gguf_pooling); ValueError naming what cannot be served."""
    if task not in MODEL_TASKS:
        raise ValueError(f"task={task!r} is invalid: use one of {list(MODEL_TASKS)}")
    mode, normalize, has_st = _GGUF_MODES.get(gguf_pooling or 0, "last"), True, False
    if folder is not None and os.path.isfile(os.path.join(folder, "modules.json")):
        mode, normalize = _sentence_transformers(folder)
        has_st = True
    labels = config.num_labels
    if task == "auto":
        task = ("reward" if labels == 1 else "classify") if labels else \
            ("embed" if has_st else "generate")
    if task in ("classify", "reward") and not labels:
        raise ValueError(f"task={task!r} needs a classification head (a "
                         "*ForSequenceClassification checkpoint); this model has an LM head: "
                         "use task 'rerank' to score by its yes/no tokens, or 'embed'")
    if task == "generate" and not generates:
        raise ValueError("task='generate': this checkpoint has a classification head and no LM "
                         "head; use task 'classify', 'reward' or 'rerank'")
    rerank_tokens: tuple[int, ...] = ()
    if task == "rerank":
        if labels > 1:
            raise ValueError(f"task='rerank' on a classifier needs one label (a cross-encoder's "
                             f"score); this one has {labels}")
        if not labels:
            rerank_tokens = tuple(_single_token(tokenizer, word) for word in RERANK_WORDS)
            rerank_prompt(tokenizer, "a query", "a document")  # refused now, not per request
    return PoolingInfo(mode=mode, normalize=normalize, hidden_size=config.hidden_size,
                       num_labels=labels, labels=config.labels, generates=generates,
                       task=task, rerank_tokens=rerank_tokens)


def _sentence_transformers(folder: str) -> tuple[str, bool]:
    with open(os.path.join(folder, "modules.json")) as f:
        modules = json.load(f)
    if not isinstance(modules, list):
        raise ValueError(f"{folder}/modules.json is not a list of modules")
    mode, normalize = "last", False
    for module in modules:
        kind = str(module.get("type", "")).rsplit(".", 1)[-1]
        if kind not in _ST_PASSIVE:
            raise ValueError(f"{folder}: the sentence-transformers module {kind!r} "
                             f"({module.get('path')}) is not supported; served: a Transformer, "
                             "a Pooling (last token, mean, CLS) and a Normalize module")
        if kind == "Normalize":
            normalize = True
        if kind == "Pooling":
            mode = _pooling_mode(os.path.join(folder, str(module.get("path", "")),
                                              "config.json"))
    return mode, normalize


def _pooling_mode(path: str) -> str:
    with open(path) as f:
        cfg = json.load(f)
    given = cfg.get("pooling_mode")
    if given is None:
        given = [mode for key, mode in _ST_FLAGS.items() if cfg.get(key)]
    modes = [given] if isinstance(given, str) else list(given)
    if len(modes) != 1 or modes[0] not in _ST_MODES:
        raise ValueError(f"{path}: pooling {modes} is not supported; served: one of "
                         f"{sorted(_ST_MODES)}")
    return _ST_MODES[modes[0]]


def rerank_prompt(tokenizer: Any, query: str, document: str,
                  instruction: str | None = None) -> str:
    """A language model reranker's prompt (Qwen3-Reranker's): a system message asking for yes or
    no, then the instruction, the query and the document as the user's message, through the
    chat template with thinking off. A template without a system role (Gemma's) gets the system
    text at the head of the user's message. ValueError when the template renders neither."""
    task = DEFAULT_RERANK_INSTRUCTION if instruction is None else instruction
    body = f"<Instruct>: {task}\n<Query>: {query}\n<Document>: {document}"
    attempts = ([{"role": "system", "content": RERANK_SYSTEM}, {"role": "user", "content": body}],
                [{"role": "user", "content": f"{RERANK_SYSTEM}\n\n{body}"}])
    problem: Exception | None = None
    for messages in attempts:
        try:
            return str(tokenizer.apply_chat_template(messages, tokenize=False,
                                                     add_generation_prompt=True,
                                                     enable_thinking=False))
        except Exception as exc:  # jinja2's TemplateError, a missing template (ValueError)
            problem = exc
    raise ValueError(f"task='rerank' writes its prompt with the model's chat template, which "
                     f"failed: {problem}") from None


def _single_token(tokenizer: Any, word: str) -> int:
    if tokenizer is None:
        raise ValueError("task='rerank' reads the tokens 'yes' and 'no': the model has no "
                         "tokenizer")
    ids = tokenizer.encode(word, add_special_tokens=False)
    if len(ids) != 1:
        raise ValueError(f"task='rerank' scores by the tokens {list(RERANK_WORDS)}; this "
                         f"tokenizer splits {word!r} into {len(ids)} tokens")
    return int(ids[0])
