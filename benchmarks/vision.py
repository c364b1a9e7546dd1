"""A multi-turn screenshot agent: the same screenshot re-sent every turn, on radixrt with the
radix cache on and off, and on HF transformers, in one run, on this CPU.

A vision-language checkpoint of SmolVLM-256M's shape is built with transformers' own classes
(random weights, nothing downloaded; Idefics3's architecture: a SigLIP-style tower over tiles of
--tile pixels, a pixel shuffle by 4, SmolLM2-135M's decoder) and saved with the default model's
tokenizer. A synthetic --width x --height screenshot (panels, buttons, lines of text) is split
by the processor into tiles + a global view.

The agent's conversation: turn 1 is the screenshot and a question; each next turn re-sends the
whole conversation -- the same screenshot, the answers so far -- with one more question (as an
agent's client does). Each turn is timed to its first token (TTFT; the answer is --answer-tokens
greedy tokens, appended to the conversation):

- radixrt, radix cache on: turn 2+ finds the screenshot's placeholders and the turns before in
  the tree (the image is neither encoded nor prefilled again);
- radixrt, radix cache off: every turn prefills the whole conversation (the image's features
  come from the encoder's cache by digest, so the tower runs once);
- HF transformers: every turn runs the processor, the tower and the whole prefill.

The image encoder's own time (the tower + connector, one screenshot) is reported beside. The
goal: turn 2+ TTFT <= 0.3x turn 1's with the cache on.

    python benchmarks/vision.py            # about a minute on 2 cores
    python benchmarks/vision.py --quick    # tiny sizes (a smoke test)
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from plots import add_plot_dir, bar_panels, plot_path  # noqa: E402

import radixrt  # noqa: E402

SYSTEMS = ("radixrt (cache on)", "radixrt (cache off)", "HF transformers")
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.content is string %}{{ m.content }}{% else %}{% for c in m.content %}"
    "{% if c.type == 'image' %}<image>\n{% else %}{{ c.text }}{% endif %}{% endfor %}{% endif %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
QUESTIONS = ("Which button saves the form?", "Where is the search field?",
             "What does the red banner say?", "Which menu holds the settings?",
             "Is the checkbox ticked?", "What is the window's title?")


@dataclass(frozen=True)
class TurnRow:
    system: str
    turn: int
    prompt_tokens: int  # HF's rows (the processor's count); radixrt's: its cached tokens
    ttft_ms: float


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--width", type=int, default=1024, help="the screenshot's width (pixels)")
    p.add_argument("--height", type=int, default=768)
    p.add_argument("--tile", type=int, default=384, help="the tower's image size (pixels)")
    p.add_argument("--vision-layers", type=int, default=6)
    p.add_argument("--vision-hidden", type=int, default=384)
    p.add_argument("--text-layers", type=int, default=30)
    p.add_argument("--answer-tokens", type=int, default=16)
    p.add_argument("--runs", type=int, default=3, help="conversations per system (medians)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test")
    add_plot_dir(p)
    args = p.parse_args(argv)
    if args.quick:
        args.turns, args.width, args.height, args.tile = 3, 96, 64, 32
        args.vision_layers, args.vision_hidden, args.text_layers = 2, 64, 2
        args.answer_tokens, args.runs = 4, 1
    if args.turns < 2 or args.turns > len(QUESTIONS):
        p.error(f"--turns: 2 to {len(QUESTIONS)}")
    return args


def build_model(args: argparse.Namespace, folder: str) -> tuple[Any, Any]:
    """(transformers model, processor) of the checkpoint saved in folder."""
    import copy

    import transformers as tf

    from radixrt.runtime.models.loader import load_tokenizer

    tokenizer = copy.deepcopy(load_tokenizer("default"))
    tokenizer.add_special_tokens({"additional_special_tokens": [
        "<image>", "<fake_token_around_image>", "<global-img>"]})
    patch = args.tile // 24 if args.tile >= 96 else args.tile // 8
    scale = 4 if args.tile >= 96 else 2
    vision = tf.Idefics3VisionConfig(
        hidden_size=args.vision_hidden, intermediate_size=4 * args.vision_hidden,
        num_hidden_layers=args.vision_layers, num_attention_heads=max(args.vision_hidden // 64, 2),
        image_size=args.tile, patch_size=patch)
    text = tf.LlamaConfig(hidden_size=576, intermediate_size=1536,
                          num_hidden_layers=args.text_layers,
                          num_attention_heads=9, num_key_value_heads=3, vocab_size=len(tokenizer),
                          max_position_embeddings=8192, tie_word_embeddings=True,
                          bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    config = tf.Idefics3Config(vision_config=vision, text_config=text, scale_factor=scale,
                               image_token_id=tokenizer.convert_tokens_to_ids("<image>"))
    torch.manual_seed(args.seed)
    model = tf.Idefics3ForConditionalGeneration(config).eval()
    processor = tf.Idefics3Processor(
        image_processor=tf.Idefics3ImageProcessor(size={"longest_edge": 2 * args.tile},
                                                  max_image_size={"longest_edge": args.tile}),
        tokenizer=tokenizer, image_seq_len=(args.tile // patch // scale) ** 2,
        chat_template=CHAT_TEMPLATE)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return model, processor


def screenshot(args: argparse.Namespace) -> Any:
    """A synthetic application window: a title bar, a banner, panels, buttons, text lines."""
    from PIL import Image, ImageDraw

    w, h = args.width, args.height
    image = Image.new("RGB", (w, h), (240, 240, 242))
    draw = ImageDraw.Draw(image)
    draw.rectangle((0, 0, w, h // 16), fill=(40, 60, 110))
    draw.rectangle((w // 20, h // 10, w - w // 20, h // 6), fill=(200, 40, 40))
    for i in range(6):
        top = h // 5 + i * h // 9
        draw.rectangle((w // 20, top, w // 2, top + h // 14), outline=(90, 90, 90))
        draw.text((w // 20 + 4, top + 2), f"Field {i}: value {i * 37 % 101}", fill=(0, 0, 0))
        draw.rectangle((w - w // 4, top, w - w // 20, top + h // 14), fill=(60, 140, 60))
    return image


def conversation(picture: Any, answers: list[str], turn: int) -> list[dict[str, Any]]:
    """Turn `turn` (0-based): the screenshot and every question so far, with the answers."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": [
        {"type": "image", "image": picture}, {"type": "text", "text": QUESTIONS[0]}]}]
    for t in range(turn):
        messages += [{"role": "assistant", "content": answers[t]},
                     {"role": "user", "content": QUESTIONS[t + 1]}]
    return messages


async def timed_turn(engine: radixrt.Engine, messages: list[dict[str, Any]],
                     params: radixrt.SamplingParams) -> tuple[float, str, int]:
    """(TTFT seconds, the answer, prompt tokens from the radix cache) of one streamed
    request."""
    start = time.perf_counter()
    first, text, cached = None, "", 0
    async for chunk in engine.generate_stream(messages, params):
        first = first or time.perf_counter() - start
        text += chunk.text
        cached = max(cached, chunk.cached_tokens)
    return first or 0.0, text, cached


def radixrt_rows(path: str, picture: Any, args: argparse.Namespace, cache: bool
                 ) -> tuple[list[TurnRow], list[str], dict[str, float]]:
    system = SYSTEMS[0] if cache else SYSTEMS[1]
    params = radixrt.SamplingParams(max_tokens=args.answer_tokens, temperature=0,
                                    ignore_eos=True)
    times: dict[int, list[float]] = {}
    prompts: dict[int, int] = {}
    answers: list[str] = []
    encoder: dict[str, float] = {}
    for _ in range(args.runs):  # a fresh engine per conversation: turn 1 starts cold
        engine = radixrt.Engine(path, disable_radix_cache=not cache)
        try:
            answers = []
            for turn in range(args.turns):
                ttft, text, prompt = asyncio.run(
                    timed_turn(engine, conversation(picture, answers, turn), params))
                times.setdefault(turn, []).append(ttft)
                prompts[turn] = prompt
                answers.append(text)
            encoder = engine.stats()  # the vision encoder's images_encoded and seconds
        finally:
            engine.close()
    rows = [TurnRow(system, t + 1, prompts[t], 1000 * statistics.median(times[t]))
            for t in range(args.turns)]
    return rows, answers, encoder


def hf_rows(model: Any, processor: Any, picture: Any, answers: list[str],
            args: argparse.Namespace) -> list[TurnRow]:
    """HF transformers on the same conversations (radixrt's answers as the history): the
    processor, the tower and the prefill of the whole prompt every turn, to its first token."""
    rows = []
    for turn in range(args.turns):
        messages = conversation(picture, answers, turn)
        for message in messages:
            if isinstance(message["content"], list):
                message["content"] = [{"type": c["type"], **({"text": c["text"]}
                                                            if "text" in c else {})}
                                      for c in message["content"]]
        times, prompt = [], 0
        for _ in range(args.runs):
            start = time.perf_counter()
            text = processor.apply_chat_template(messages, add_generation_prompt=True)
            inputs = processor(text=text, images=[picture], add_special_tokens=False,
                               return_tensors="pt")
            with torch.no_grad():
                model.generate(**inputs, do_sample=False, max_new_tokens=1,
                               pad_token_id=processor.tokenizer.eos_token_id)
            times.append(time.perf_counter() - start)
            prompt = int(inputs["input_ids"].shape[1])
        rows.append(TurnRow(SYSTEMS[2], turn + 1, prompt, 1000 * statistics.median(times)))
    return rows


def encoder_ms(model: Any, processor: Any, picture: Any, runs: int) -> float:
    """The tower + connector on one screenshot (all its tiles), median ms."""
    inputs = processor(text="<image>", images=[picture], return_tensors="pt")
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        with torch.no_grad():
            model.model.get_image_features(inputs["pixel_values"], inputs["pixel_attention_mask"])
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def report(rows: list[TurnRow], encoder: dict[str, float], tower_ms: float,
           args: argparse.Namespace) -> list[str]:
    def ttft(system: str, turn: int) -> float:
        return next(r.ttft_ms for r in rows if (r.system, r.turn) == (system, turn))

    def prompt(system: str, turn: int) -> int:
        return next(r.prompt_tokens for r in rows if (r.system, r.turn) == (system, turn))

    lines = [f"a {args.width} x {args.height} screenshot re-sent for {args.turns} turns; "
             f"tiles of {args.tile} px, tower {args.vision_layers} layers x "
             f"{args.vision_hidden}, decoder {args.text_layers} layers x 576; answers of "
             f"{args.answer_tokens} tokens; medians of {args.runs}",
             "| turn | prompt tokens | cached (cache on) | "
             + " | ".join(f"{s} TTFT (ms)" for s in SYSTEMS) + " |",
             "|---|---|---|" + "---|" * len(SYSTEMS)]
    for turn in range(1, args.turns + 1):
        lines.append(f"| {turn} | {prompt(SYSTEMS[2], turn)} | {prompt(SYSTEMS[0], turn)} | "
                     + " | ".join(f"{ttft(s, turn):.1f}" for s in SYSTEMS) + " |")
    later = [ttft(SYSTEMS[0], t) for t in range(2, args.turns + 1)]
    lines.append(f"turn 2+ / turn 1 TTFT, cache on: {max(later) / ttft(SYSTEMS[0], 1):.2f}x "
                 "(the worst later turn; goal <= 0.3x)")
    for s in SYSTEMS[1:]:
        ratio = statistics.mean(ttft(SYSTEMS[0], t) / ttft(s, t)
                                for t in range(2, args.turns + 1))
        lines.append(f"turn 2+ TTFT, radixrt (cache on) / {s} = {ratio:.2f}x")
    lines.append(f"image encoder (tower + connector, one screenshot): {tower_ms:.1f} ms on HF "
                 f"transformers; radixrt encoded {int(encoder['images_encoded'])} image(s) in "
                 f"the last conversation, {1000 * encoder['image_encode_seconds']:.1f} ms in all")
    return lines


def draw(rows: list[TurnRow], args: argparse.Namespace) -> str | None:
    turns = [f"turn {t}" for t in range(1, args.turns + 1)]
    series = {s: [next(r.ttft_ms for r in rows if (r.system, r.turn) == (s, t))
                  for t in range(1, args.turns + 1)] for s in SYSTEMS}
    return bar_panels(plot_path("vision", args.plot_dir),
                      "A screenshot agent: TTFT per turn, the same image re-sent; this CPU",
                      turns, [("TTFT (ms)", series)])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        model, processor = build_model(args, folder)
        picture = screenshot(args)
        rows, answers, encoder = radixrt_rows(folder, picture, args, cache=True)
        rows += radixrt_rows(folder, picture, args, cache=False)[0]
        rows += hf_rows(model, processor, picture, answers, args)
        tower_ms = encoder_ms(model, processor, picture, args.runs)
    print(f"# benchmarks/vision.py {' '.join(sys.argv[1:])} "
          f"({datetime.date.today()}, {torch.get_num_threads()} threads)")
    print("\n".join(report(rows, encoder, tower_ms, args)))
    if draw(rows, args) is None:
        print("plot skipped (no matplotlib)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
