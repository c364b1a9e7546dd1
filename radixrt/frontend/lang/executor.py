"""StreamExecutor: runs what a program appends to one state, in order, apart from the program
(on a thread of its own with `run`, as a greenlet on the event loop with `arun`: runners.py).

`s += expr` only queues the expression, so a program's forks run at the same time; reading a
variable (`s["x"]`) or the text waits for the work it depends on. A failure stops the state: the
rest of its queue is dropped and every reader gets the exception.

Every piece of text is logged as it is appended, with its variable and its meta info (a gen's
streamed pieces: stream_meta.py), for the text iterators. With `spec_tokens` (the program's
num_api_spec_tokens), gens take their values from speculated text where they can
(speculation.py).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Iterator
from typing import Any

from radixrt.frontend.lang.backend import (
    SEPARATE_REASONING,
    Backend,
    BackendError,
    GenResult,
    PieceMeta,
)
from radixrt.frontend.lang.global_config import global_config
from radixrt.frontend.lang.ir import (
    Embed,
    Gen,
    Image,
    RoleBegin,
    RoleEnd,
    Select,
    SetVar,
    Text,
    TextWithImages,
    ToolPrompt,
    VarScopeBegin,
    VarScopeEnd,
    as_expr,
    flatten,
)
from radixrt.frontend.lang.runners import LoopCondition, LoopRunner, ThreadRunner
from radixrt.frontend.lang.select_methods import pick
from radixrt.frontend.lang.sglang_names import LORA, TOKEN_TEXTS
from radixrt.frontend.lang.speculation import Speculation, Taken, speculates
from radixrt.frontend.lang.stream_meta import GenStream, with_token_texts
from radixrt.frontend.lang.tools import parse_calls
from radixrt.frontend.lang.transcript import Transcript

_END = object()
# rx.image on a backend whose chat format names no image token (and says nothing of its own)
NO_IMAGES = ("rx.image: the model takes no images (the runtime names no image token): run the "
             "program on a vision-language model (LLaVA, Idefics3, ...) served by rx.Runtime or "
             "rx.RuntimeEndpoint")


class StreamExecutor:
    def __init__(
        self,
        backend: Backend,
        transcript: Transcript,
        variables: dict[str, Any] | None = None,
        stream: bool = False,
        priority: int = 0,
        defaults: dict[str, Any] | None = None,
        runner: ThreadRunner | LoopRunner | None = None,
        spec_tokens: int | None = None,
    ) -> None:
        self.backend = backend
        self.runner = runner or ThreadRunner()
        self.priority = priority  # of every gen / select that does not name its own
        self.defaults: dict[str, Any] = dict(defaults or {})  # the run's sampling options
        self._scopes: dict[str, list[int]] = {}  # var_scope name -> text positions it began at
        self.transcript = transcript
        self.variables: dict[str, Any] = dict(variables or {})
        self.meta: dict[str, dict[str, Any]] = {}
        self.set_here: list[str] = []  # variables this state set itself (not inherited), in order
        self.stream = stream
        self.error: BaseException | None = None
        self._cond = self.runner.condition()
        self._pending = 0  # leaves queued and not yet run
        self._done = False
        # (variable or None, text, meta info or None) as appended
        self._log: list[tuple[str | None, str, dict[str, Any] | None]] = []
        self.speculation = None if spec_tokens is None else Speculation(spec_tokens)
        self._queue = self.runner.queue()
        self._join = self.runner.start(self._loop, "radixrt-state")

    def child(self) -> StreamExecutor:
        """A fork's executor: a copy of this state's text and variables, the same backend,
        priority, sampling defaults and runner; no speculation (as in SGLang: a child's gens
        call for themselves, with no N tokens written past each)."""
        return StreamExecutor(self.backend, self.transcript.copy(), self.variables, self.stream,
                              self.priority, self.defaults, self.runner)

    def pin(self, text: str) -> Any:
        """Pin `text`, this state's text so far (its images go with it)."""
        return self.runner.call(self.backend, "pin", text, priority=self.priority,
                                images=self.transcript.images)

    def unpin(self, handle: Any) -> None:
        self.runner.call(self.backend, "unpin", handle)

    # --- called by the program's thread -----------------------------------------------------
    def submit(self, expr: Any) -> None:
        leaves = flatten(as_expr(expr))
        with self._cond:
            self._raise_if_failed()
            if self._done:
                raise RuntimeError("this program state has ended: nothing more can be appended")
            self._pending += len(leaves)
        for leaf in leaves:
            self._queue.put(leaf)

    def sync(self) -> None:
        """Wait until everything queued so far has run; raise the state's failure if any."""
        with self._cond:
            self._cond.wait_for(lambda: self._pending == 0 or self.error is not None)
            self._raise_if_failed()

    def get(self, name: str) -> Any:
        """The variable's value, once the gen/select that sets it has run."""
        with self._cond:
            self._cond.wait_for(
                lambda: name in self.variables or self.error is not None or self._pending == 0
            )
            self._raise_if_failed()
            if name not in self.variables:
                known = sorted(self.variables)
                raise KeyError(f"variable {name!r} is not set; set so far: {known}")
            return self.variables[name]

    def end(self) -> None:
        """Finish the queue and stop the thread (raises the state's failure, if any)."""
        with self._cond:
            if self._done:
                self._raise_if_failed()
                return
        self._queue.put(_END)
        self._join()
        with self._cond:
            self._raise_if_failed()

    def merge(self, values: dict[str, Any], meta: dict[str, Any]) -> None:
        """Join: take the children's variables (each a list, one value per child)."""
        with self._cond:
            self.variables.update(values)
            self.meta.update(meta)
            self.set_here += [n for n in values if n not in self.set_here]  # nested joins
            self._cond.notify_all()

    def assign(self, name: str, value: Any) -> None:
        """`state[name] = value`: in order with what was appended (as a gen would set it), or at
        once on a state that has ended (SGLang's set_var after the run)."""
        with self._cond:
            if self._done and self.error is None:
                self.variables[name] = value
                self.meta[name] = {}
                if name not in self.set_here:
                    self.set_here.append(name)
                return
        self.submit(SetVar(name, value))

    def pieces(self, name: str | None, with_meta: bool = False) -> Iterator[Any]:
        """Text as it is appended: of one variable, or (name None) everything; with_meta:
        (text, meta info) pairs (stream_meta.py; {} for text no gen or select made)."""
        index = 0
        while True:
            with self._cond:
                self._cond.wait_for(functools.partial(self._has_news, index, name))
                batch = self._log[index:]
                index = len(self._log)
                finished = self._finished_for(name)
            for var, text, meta in batch:
                if name is None or var == name:
                    yield (text, meta or {}) if with_meta else text
            if finished:
                with self._cond:
                    self._raise_if_failed()
                return

    async def apieces(self, name: str | None, with_meta: bool = False) -> AsyncIterator[Any]:
        """`pieces` for async code on the event loop of an arun (a state of `run`: its
        blocking iterator, one step at a time on a worker thread)."""
        if not isinstance(self._cond, LoopCondition):
            pieces, done = self.pieces(name, with_meta), object()
            while (piece := await asyncio.to_thread(next, pieces, done)) is not done:
                yield piece
            return
        index = 0
        while True:
            while not self._has_news(index, name):
                await self._cond.wait_async()
            batch, index = self._log[index:], len(self._log)
            for var, text, meta in batch:
                if name is None or var == name:
                    yield (text, meta or {}) if with_meta else text
            if self._finished_for(name):
                self._raise_if_failed()
                return

    # --- the executor thread -----------------------------------------------------------------
    def _loop(self) -> None:
        try:
            while True:
                leaf = self._queue.get()  # arun: a cancel while idle ends the loop here
                if leaf is _END:
                    break
                try:
                    if self.error is None:
                        self._run(leaf)
                except BaseException as exc:  # noqa: BLE001 - any failure ends the state
                    with self._cond:
                        self.error = exc
                finally:
                    with self._cond:
                        self._pending -= 1
                        self._cond.notify_all()
        finally:  # however the loop ends, every reader wakes up and sees it
            with self._cond:
                self._done = True
                self._cond.notify_all()

    def fail(self, exc: BaseException) -> None:
        """The program failed (outside any expression): readers of this state see it."""
        with self._cond:
            self.error = self.error or exc
            self._cond.notify_all()

    def _run(self, leaf: Any) -> None:
        if isinstance(leaf, Text):
            self._append(None, leaf.text)
        elif isinstance(leaf, Image):
            self._image(leaf)
        elif isinstance(leaf, TextWithImages):
            self.transcript.images += leaf.images
            self._append(None, leaf.text)
        elif isinstance(leaf, RoleBegin):
            self._append(None, self.transcript.begin_role(leaf.role), add=False)
        elif isinstance(leaf, RoleEnd):
            self._append(None, self.transcript.end_role(leaf.role), add=False)
        elif isinstance(leaf, VarScopeBegin):
            self._scopes.setdefault(leaf.name, []).append(len(self.transcript.text))
        elif isinstance(leaf, VarScopeEnd):
            start = self._scopes[leaf.name].pop()
            self._set(leaf.name, self.transcript.text[start:], {})
        elif isinstance(leaf, SetVar):
            self._set(leaf.name, leaf.value, {})
        elif isinstance(leaf, ToolPrompt):
            prompt = self.transcript.chat().tool_prompt
            if not prompt:
                raise BackendError("this backend has no tool prompt: rx.tool_prompt needs "
                                   "rx.RuntimeEndpoint or rx.Runtime")
            self._append(None, prompt.replace("{tools}", leaf.listing))
        elif isinstance(leaf, Gen):
            self._gen(leaf)
        elif isinstance(leaf, Select):
            self._select(leaf)
        elif isinstance(leaf, Embed):
            self._embed(leaf)
        else:
            raise TypeError(f"cannot run {leaf!r}")

    def _gen(self, leaf: Gen) -> None:
        params = {**self.defaults, **leaf.params}  # the gen's own options (its constraint) win
        texts = bool(params.pop(TOKEN_TEXTS, False))
        if not global_config.skip_special_tokens_in_output:
            params.setdefault("skip_special_tokens", False)
        if leaf.separate_reasoning:  # not a sampling field: the runtime's endpoint takes it
            params[SEPARATE_REASONING] = True
        spec = self.speculation
        if spec is not None and speculates(params):
            taken = spec.take(params)
            if taken is None:  # nothing (fitting) speculated: one call that writes on past it
                self._speculate(leaf, params)
                taken = spec.take(params)
            if taken is not None:
                self._take(leaf, taken)
                return
        if spec is not None:
            spec.drop()  # this gen calls for real: its output is not the speculated text
        self._call(leaf, params, texts)

    def _call(self, leaf: Gen, params: dict[str, Any], texts: bool) -> None:
        """One generate for the gen, streamed into the log when the run streams."""
        streamed: list[str] = []
        stream = GenStream(bool(params.get("logprobs") or params.get("top_logprobs")))

        def on_piece(piece: str, meta: PieceMeta | None = None) -> None:
            out = stream.piece(piece, meta)
            if piece:
                streamed.append(piece)
                self._log_piece(leaf.name, piece, self._texts(out) if texts else out)

        result = self.runner.call(self.backend, "generate", self.transcript.text, params,
                                  on_piece if self.stream else None,
                                  priority=self._priority(leaf.priority),
                                  images=self.transcript.images)
        value, extra = self._value(leaf, result)
        meta = {
            **extra,
            "finish_reason": result.finish_reason,
            "prompt_tokens": result.prompt_tokens,
            "cached_tokens": result.cached_tokens,
            "completion_tokens": result.completion_tokens,
            **result.logprobs,
        }
        if texts:
            meta = self._texts(meta)
        self.transcript.text += result.text
        already = "".join(streamed)
        if result.text.startswith(already) and len(result.text) > len(already):
            self._log_piece(leaf.name, result.text[len(already):], stream.last(meta))
        self._set(leaf.name, value, meta)

    def _value(self, leaf: Gen, result: GenResult) -> tuple[Any, dict[str, Any]]:
        """The gen's variable from its result (and the meta info that comes with it)."""
        reason = result.finish_reason or ""
        what = f"gen {leaf.name!r}" if leaf.name else "gen"
        if reason.startswith("error"):  # the runtime ended it: never a silent empty answer
            raise BackendError(f"{what} failed in the runtime: {reason.removeprefix('error: ')}")
        value: Any = result.text
        extra: dict[str, Any] = {}
        if leaf.separate_reasoning:
            value = result.content if result.content is not None else result.text
            extra["reasoning"] = result.reasoning
        if leaf.constraint_kind == "tool_calls":
            try:
                value = parse_calls(result.tool_calls)
            except ValueError as exc:
                raise BackendError(f"{what}: {exc}") from None
        return value, extra

    def _speculate(self, leaf: Gen, params: dict[str, Any]) -> None:
        """The speculative call: the gen's options, no stop strings, N tokens at least; its
        pieces are counted (streamed) so that later gens take whole tokens."""
        spec = self.speculation
        assert spec is not None
        pieces: list[tuple[str, int]] = []

        def on_piece(piece: str, meta: PieceMeta | None = None) -> None:
            pieces.append((piece, meta.tokens if meta is not None else int(bool(piece))))

        result = self.runner.call(self.backend, "generate", self.transcript.text,
                                  spec.call_params(params), on_piece,
                                  priority=self._priority(leaf.priority),
                                  images=self.transcript.images)
        self._value(leaf, result)  # a runtime error raises here
        spec.keep(params, pieces, result.text, result.completion_tokens, result.finish_reason,
                  result.prompt_tokens, result.cached_tokens)

    def _take(self, leaf: Gen, taken: Taken) -> None:
        """The gen's value from speculated text: appended and set as its own call's would be."""
        meta = {"finish_reason": taken.finish_reason, "prompt_tokens": taken.prompt_tokens,
                "cached_tokens": taken.cached_tokens, "completion_tokens": taken.tokens,
                "speculative": True}
        self.transcript.text += taken.text
        self._log_piece(leaf.name, taken.text, dict(meta))
        self._set(leaf.name, taken.text, meta)

    def _texts(self, meta: dict[str, Any]) -> dict[str, Any]:
        """return_text_in_logprobs: decoded with the backend's tokenizer (stream_meta.py)."""
        return with_token_texts(meta, getattr(self.backend, "token_texts", None))

    def _select(self, leaf: Select) -> None:
        if self.defaults.get(LORA):
            raise BackendError("select scores its choices with the base model; in a run under "
                               "a LoRA adapter use gen(choices=...), which decodes them under it")
        unconditional = leaf.method == "unconditional_likelihood_normalized"
        scored = self.runner.call(self.backend, "score", self.transcript.text,
                                  list(leaf.choices), unconditional,
                                  priority=self._priority(leaf.priority),
                                  images=self.transcript.images)
        best, scores = pick(leaf.method, scored)
        choice = leaf.choices[best]
        meta = {
            "method": leaf.method,
            "scores": scores,
            "token_logprobs": [c.logprobs for c in scored],
            "unconditional_token_logprobs": [c.unconditional for c in scored],
        }
        self._append(leaf.name, choice, meta=meta)
        self._set(leaf.name, choice, meta)

    def _embed(self, leaf: Embed) -> None:
        text = self.transcript.text if leaf.text is None else leaf.text
        if not text:
            raise BackendError("embed of an empty program: append text first, or give text=")
        if leaf.text is None and self.transcript.images:
            raise BackendError("embed of the program's text: it holds images, which embeddings "
                               "do not take; give the text to embed as text=")
        vector = self.runner.call(self.backend, "embed", text, leaf.dimensions,
                                  priority=self._priority(leaf.priority))
        self._set(leaf.name, list(vector), {"dimensions": len(vector)})

    def _image(self, leaf: Image) -> None:
        """The model's image token into the text, the image's bytes beside it (sent with every
        call on this text from now on)."""
        token = self.transcript.chat().image_token
        if not token:
            raise BackendError(getattr(self.backend, "no_images", None) or NO_IMAGES)
        if self.speculation is not None:
            self.speculation.drop()  # what was speculated did not see the image
        self.transcript.images.append(leaf.data)
        self._append(None, token)

    def _priority(self, own: int | None) -> int:
        return self.priority if own is None else own

    def _append(self, name: str | None, text: str, add: bool = True,
                meta: dict[str, Any] | None = None) -> None:
        """Text the program appends (not a gen's output): logged, and matched against what is
        speculated (add=False: the transcript has it already)."""
        if add:
            self.transcript.text += text
        if self.speculation is not None:
            self.speculation.fill(text)
        self._log_piece(name, text, meta)

    def _log_piece(self, name: str | None, text: str,
                   meta: dict[str, Any] | None = None) -> None:
        if text:
            with self._cond:
                self._log.append((name, text, meta))
                self._cond.notify_all()

    def _set(self, name: str | None, value: Any, meta: dict[str, Any]) -> None:
        if name is None:
            return
        with self._cond:
            self.variables[name] = value
            self.meta[name] = meta
            if name not in self.set_here:
                self.set_here.append(name)
            self._cond.notify_all()

    # --- helpers (hold self._cond) ----------------------------------------------------------
    def _has_news(self, index: int, name: str | None) -> bool:
        return index < len(self._log) or self._finished_for(name)

    def _finished_for(self, name: str | None) -> bool:
        if self.error is not None or self._done:
            return True
        return name is not None and name in self.variables

    def _raise_if_failed(self) -> None:
        if self.error is not None:
            raise self.error
