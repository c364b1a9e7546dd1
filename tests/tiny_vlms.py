"""Tiny random-weight vision-language checkpoints, built with transformers' own classes and
processors from configs written here (nothing is downloaded): the default model's tokenizer
with the family's image token(s) added, a small vision tower, the family's projector, and a
4-layer decoder of width 64. `images` draws deterministic test pictures of any size."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from tiny_models import TINY, randomize_weights

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.content is string %}{{ m.content }}{% else %}{% for c in m.content %}"
    "{% if c.type == 'image' %}<image>\n{% else %}{{ c.text }}{% endif %}{% endfor %}{% endif %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
PATCH = 7
IMAGE_SIDE = 28  # CLIP crops to this: (28 / 7) ** 2 = 16 patches, 16 placeholders an image


def images(sizes: list[tuple[int, int]], seed: int = 0) -> list[Any]:
    """RGB pictures of the given (width, height), from a seeded generator."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
            for w, h in sizes]


def _tokenizer_with(tokenizer: Any, tokens: list[str]) -> Any:
    import copy

    tok = copy.deepcopy(tokenizer)
    tok.add_special_tokens({"additional_special_tokens": tokens})
    return tok


def build_llava(folder: Path, tokenizer: Any, seed: int = 0) -> tuple[Any, Any]:
    """A LLaVA-1.5 checkpoint (CLIP tower of 2 layers, hidden states of layer -2 without CLS,
    the MLP projector) in folder; returns (transformers model, processor)."""
    import transformers as tf

    tok = _tokenizer_with(tokenizer, ["<image>"])
    vision = tf.CLIPVisionConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                 num_attention_heads=4, image_size=IMAGE_SIDE, patch_size=PATCH)
    text = tf.LlamaConfig(**{**TINY, "vocab_size": len(tok)}, bos_token_id=tok.bos_token_id,
                          eos_token_id=tok.eos_token_id)
    config = tf.LlavaConfig(vision_config=vision, text_config=text,
                            image_token_id=tok.convert_tokens_to_ids("<image>"),
                            vision_feature_layer=-2, vision_feature_select_strategy="default",
                            image_seq_length=(IMAGE_SIDE // PATCH) ** 2)
    torch.manual_seed(seed)
    model = tf.LlavaForConditionalGeneration(config).eval()
    randomize_weights(model)
    processor = tf.LlavaProcessor(
        image_processor=tf.CLIPImageProcessor(size={"shortest_edge": IMAGE_SIDE},
                                              crop_size={"height": IMAGE_SIDE,
                                                         "width": IMAGE_SIDE}),
        tokenizer=tok, patch_size=PATCH, vision_feature_select_strategy="default",
        num_additional_image_tokens=1,  # the CLS row, as LLaVA-1.5 checkpoints write it
        chat_template=CHAT_TEMPLATE)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return model, processor


def build_llava_next(folder: Path, tokenizer: Any, seed: int = 0) -> tuple[Any, Any]:
    """A LLaVA-NeXT checkpoint (LLaVA's tower and projector, tiles of 28 pixels on grids of 1 x 2,
    2 x 1 and 2 x 2 tiles, the image_newline row) in folder; returns (model, processor)."""
    import transformers as tf

    tok = _tokenizer_with(tokenizer, ["<image>"])
    pinpoints = [[IMAGE_SIDE, 2 * IMAGE_SIDE], [2 * IMAGE_SIDE, IMAGE_SIDE],
                 [2 * IMAGE_SIDE, 2 * IMAGE_SIDE]]
    vision = tf.CLIPVisionConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                 num_attention_heads=4, image_size=IMAGE_SIDE, patch_size=PATCH)
    text = tf.LlamaConfig(**{**TINY, "vocab_size": len(tok)}, bos_token_id=tok.bos_token_id,
                          eos_token_id=tok.eos_token_id)
    config = tf.LlavaNextConfig(vision_config=vision, text_config=text,
                                image_token_id=tok.convert_tokens_to_ids("<image>"),
                                vision_feature_layer=-2,
                                vision_feature_select_strategy="default",
                                image_grid_pinpoints=pinpoints,
                                image_seq_length=(IMAGE_SIDE // PATCH) ** 2)
    torch.manual_seed(seed)
    model = tf.LlavaNextForConditionalGeneration(config).eval()
    randomize_weights(model)
    with torch.no_grad():
        model.model.image_newline.normal_(0.0, 0.5)
    processor = tf.LlavaNextProcessor(
        image_processor=tf.LlavaNextImageProcessor(
            size={"shortest_edge": IMAGE_SIDE},
            crop_size={"height": IMAGE_SIDE, "width": IMAGE_SIDE},
            image_grid_pinpoints=pinpoints),
        tokenizer=tok, patch_size=PATCH, vision_feature_select_strategy="default",
        num_additional_image_tokens=1, chat_template=CHAT_TEMPLATE)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return model, processor


def build_idefics3(folder: Path, tokenizer: Any, seed: int = 0) -> tuple[Any, Any]:
    """An Idefics3 checkpoint (its SigLIP-style tower of 2 layers over tiles of 28 pixels, a
    larger image split into up to 2 x 2 tiles + the global view, pixel shuffle by 2: 4
    placeholders a tile) in folder; returns (transformers model, processor)."""
    import transformers as tf

    tok = _tokenizer_with(tokenizer, ["<image>", "<fake_token_around_image>", "<global-img>"])
    vision = tf.Idefics3VisionConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                     num_attention_heads=4, image_size=IMAGE_SIDE,
                                     patch_size=PATCH)
    text = tf.LlamaConfig(**{**TINY, "vocab_size": len(tok)}, bos_token_id=tok.bos_token_id,
                          eos_token_id=tok.eos_token_id)
    config = tf.Idefics3Config(vision_config=vision, text_config=text, scale_factor=2,
                               image_token_id=tok.convert_tokens_to_ids("<image>"))
    torch.manual_seed(seed)
    model = tf.Idefics3ForConditionalGeneration(config).eval()
    randomize_weights(model)
    processor = tf.Idefics3Processor(
        image_processor=tf.Idefics3ImageProcessor(size={"longest_edge": 2 * IMAGE_SIDE},
                                                  max_image_size={"longest_edge": IMAGE_SIDE}),
        tokenizer=tok, image_seq_len=4, chat_template=CHAT_TEMPLATE)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return model, processor


QWEN_TEMPLATE = CHAT_TEMPLATE.replace("<image>\n", "<|vision_start|><|image_pad|><|vision_end|>")


def build_qwen2_vl(folder: Path, tokenizer: Any, seed: int = 0, v2_5: bool = False
                   ) -> tuple[Any, Any]:
    """A Qwen2-VL checkpoint (a 2-block ViT on patches of 7 at the image's own resolution,
    between 28 x 28 and 4 x 56 x 56 pixels; merge 2; multimodal RoPE sections 2 + 3 + 3 of
    the decoder's 8 frequencies) in folder; returns (transformers model, processor). v2_5:
    Qwen2.5-VL (its tower's window attention over windows of 28 pixels, full attention in
    block 1, RMSNorm and a gated MLP). The
    processor is the one radixrt loads (models/vision/processors.py): transformers builds
    Qwen2VLProcessor only with torchvision, which this machine lacks."""
    import transformers as tf

    from radixrt.runtime.models.hf_loader import load_hf_processor

    names = ["<|vision_start|>", "<|image_pad|>", "<|vision_end|>", "<|video_pad|>"]
    tok = _tokenizer_with(tokenizer, names)
    tok.chat_template = QWEN_TEMPLATE
    start, image, end, video = tok.convert_tokens_to_ids(names)
    vision = dict(depth=2, embed_dim=32, hidden_size=TINY["hidden_size"], num_heads=4,
                  mlp_ratio=2, patch_size=PATCH, spatial_merge_size=2, temporal_patch_size=2)
    if v2_5:
        vision = dict(depth=2, hidden_size=32, out_hidden_size=TINY["hidden_size"],
                      intermediate_size=48, num_heads=4, patch_size=PATCH, spatial_merge_size=2,
                      temporal_patch_size=2, window_size=2 * IMAGE_SIDE,
                      fullatt_block_indexes=[1])
    text = dict(TINY, vocab_size=len(tok), bos_token_id=tok.bos_token_id,
                eos_token_id=tok.eos_token_id,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                 "mrope_section": [2, 3, 3]})
    config_cls, model_cls = ((tf.Qwen2_5_VLConfig, tf.Qwen2_5_VLForConditionalGeneration) if v2_5
                             else (tf.Qwen2VLConfig, tf.Qwen2VLForConditionalGeneration))
    config = config_cls(vision_config=vision, text_config=text, vision_start_token_id=start,
                        image_token_id=image, vision_end_token_id=end, video_token_id=video)
    torch.manual_seed(seed)
    model = model_cls(config).eval()
    randomize_weights(model)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    tf.Qwen2VLImageProcessor(min_pixels=28 * 28, max_pixels=4 * 56 * 56, patch_size=PATCH,
                             merge_size=2, temporal_patch_size=2).save_pretrained(folder)
    return model, load_hf_processor(str(folder))


GEMMA_TEMPLATE = CHAT_TEMPLATE.replace("<image>\n", "<start_of_image>")


def build_gemma3(folder: Path, tokenizer: Any, seed: int = 0) -> tuple[Any, Any]:
    """A Gemma 3 checkpoint (a SigLIP tower of 2 layers on 56-pixel images: 8 x 8 patches,
    average-pooled to 16 rows; a decoder whose sliding window, 8, is shorter than an image, so
    an image's rows see each other both ways within the window) in folder; returns (model,
    processor)."""
    import transformers as tf

    names = {"boi_token": "<start_of_image>", "image_token": "<image_soft_token>",
             "eoi_token": "<end_of_image>"}
    tok = _tokenizer_with(tokenizer, list(names.values()))
    tok._set_model_specific_special_tokens(special_tokens=names)
    boi, soft, eoi = tok.convert_tokens_to_ids(list(names.values()))
    vision = tf.SiglipVisionConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                   num_attention_heads=4, image_size=2 * IMAGE_SIDE,
                                   patch_size=PATCH)
    text = tf.Gemma3TextConfig(
        **{**TINY, "vocab_size": len(tok)}, head_dim=24, sliding_window=8,
        query_pre_attn_scalar=20, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        layer_types=["sliding_attention", "sliding_attention", "full_attention",
                     "sliding_attention"])
    config = tf.Gemma3Config(vision_config=vision, text_config=text, mm_tokens_per_image=16,
                             boi_token_index=boi, image_token_index=soft, eoi_token_index=eoi)
    torch.manual_seed(seed)
    model = tf.Gemma3ForConditionalGeneration(config).eval()
    randomize_weights(model, 0.0)  # RMSNorm by (1 + w): w near 0
    processor = tf.Gemma3Processor(
        image_processor=tf.Gemma3ImageProcessor(size={"height": 2 * IMAGE_SIDE,
                                                      "width": 2 * IMAGE_SIDE}),
        tokenizer=tok, image_seq_length=16, chat_template=GEMMA_TEMPLATE)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return model, processor


BUILDERS = {"llava": build_llava, "llava-next": build_llava_next, "idefics3": build_idefics3,
            "qwen2-vl": build_qwen2_vl,
            "qwen2.5-vl": lambda folder, tok: build_qwen2_vl(folder, tok, v2_5=True),
            "gemma3": build_gemma3}


def hf_vlm_logprobs(model: Any, ids: list[int], image_inputs: dict[str, Any]) -> torch.Tensor:
    """[len(ids), vocab] float32 log-probabilities of transformers' forward pass over ids
    (with the images' placeholders as the image token) and the processor's image tensors."""
    input_ids = torch.tensor([ids])
    if "image_grid_thw" in image_inputs:  # Qwen2-VL's processor marks its image tokens
        image_inputs = {**image_inputs, "mm_token_type_ids":
                        (input_ids == model.config.image_token_id).int()}
    with torch.no_grad():
        logits = model(input_ids=input_ids, **image_inputs).logits[0]
    return torch.log_softmax(logits.float(), dim=-1)
