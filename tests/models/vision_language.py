"""The vision-language models of the real-model tests (issue 31): their cases, tiny random configs and
real multimodal inputs, shared by tests/models/e2e.py (which checks each against upstream on the CPU in
CI, on the GPU with opslot's `cuda` kernels, and in `make matrix`) and tests/models/test_vision_language.py
(generation, checkpoints, packing, the vision tower's slots).

A model here is its processor-facing `*ForConditionalGeneration` (the class public checkpoints load
into), fed what the model's processor produces: `input_ids` with the vision placeholders
(`<|vision_start|>`, one placeholder token per merged patch, `<|vision_end|>`), `mm_token_type_ids`
(0 text, 1 image, 2 video: the 3-D RoPE positions are computed from them), `pixel_values` +
`image_grid_thw` (patches flattened to `in_channels * temporal_patch_size * patch_size**2` features)
and `pixel_values_videos` + `video_grid_thw` (Qwen2.5-VL also `second_per_grid_ts`). Qwen3-VL's
processor writes each video frame as its own group (a timestamp, then `<|vision_start|>` frame
`<|vision_end|>`), and its RoPE index splits the video grid per frame: the inputs follow that.
Labels are the ids, -100 on padding and on the vision placeholders (what a training collator does).

This module imports nothing from the tests (e2e.py imports it).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional, Tuple

import torch

#: Token ids of the tiny configs (inside the vocabulary of 256); text tokens are drawn below 240.
IMAGE, VIDEO, VISION_START, VISION_END = 250, 251, 252, 253
TEXT_TOKENS = 240
TOKEN_IDS = dict(
    image_token_id=IMAGE, video_token_id=VIDEO, vision_start_token_id=VISION_START, vision_end_token_id=VISION_END
)

#: The image and the video of every input: (t, h, w) in patches. With spatial_merge_size 2, the image
#: is 2 x 4 = 8 placeholder tokens (Qwen2.5-VL's window of 2 x 2 merged patches splits it in two
#: windows), the video 2 frames of 2 x 2 = 8 tokens.
IMAGE_GRID = (1, 4, 8)
VIDEO_GRID = (2, 4, 4)
MERGE = 2

TEXT = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
    attention_dropout=0.0,
    use_cache=False,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=0,
    tie_word_embeddings=False,
)
#: The 3-D RoPE: head_dim 16 -> 8 frequencies, split between temporal, height and width.
MROPE = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 2, 2]}
VISION = dict(depth=2, num_heads=2, in_channels=3, patch_size=2, temporal_patch_size=2, spatial_merge_size=MERGE)


@dataclasses.dataclass
class VLCase:
    """One vision-language model: the attributes tests/models/e2e.py reads of its text cases (`key`,
    `causal_lm`, `moe`, `npu_removes`, ...), plus the composite config's parts."""

    key: str  # folder under specs/
    config_class: str  # transformers.<name>: the composite (text + vision) config
    text: Dict[str, Any]  # the text config (added to TEXT)
    vision: Dict[str, Any]  # the vision config (added to VISION)
    causal_lm: str  # the *ForConditionalGeneration: the model checked against upstream
    moe: bool = False  # forward with output_router_logits=True (reaches load_balancing_loss_func)
    npu_removes: Optional[List[str]] = None  # None: no NPU sibling; else the slots it removes
    frames_apart: bool = False  # the processor writes each video frame as its own group (Qwen3-VL)
    seconds_per_grid: bool = False  # the forward takes second_per_grid_ts for videos (Qwen2.5-VL)
    #: (op, variant) of the slots the vision tower itself dispatches (test_vision_language.py checks
    #: that running the tower alone calls them)
    vision_ops: Tuple[Tuple[str, str], ...] = ()
    # what e2e.py's text cases have and these models do not
    offset_norm: bool = False
    seq_cls: Optional[str] = None
    softcapped_loss_refused: bool = False
    fp32_router: bool = False

    @property
    def upstream_module(self) -> str:
        return f"transformers.models.{self.key}.modeling_{self.key}"

    def spec(self, target: str):
        from pathlib import Path

        return Path(__file__).resolve().parents[2] / "specs" / self.key / f"{self.key}_{target}.yaml"

    def output_name(self, target: str) -> str:
        return f"patched_modeling_{self.key}_{target}.py"


MOE_TEXT = dict(
    num_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=16,  # 2 x 16 != hidden 64: the Hub's transposed expert layout is unambiguous
    decoder_sparse_step=1,
    mlp_only_layers=[0],
    router_aux_loss_coef=0.01,
    # off by default, as in the Hub configs (from 5.23 the head reads it from the config): the e2e step
    # passes output_router_logits=True to reach the load-balancing loss; per-document comparisons
    # (packing) and generation run without the aux loss
    output_router_logits=False,
)

VL_CASES = [
    VLCase(
        "qwen2_vl",
        "Qwen2VLConfig",
        dict(rope_parameters=MROPE),
        # embed_dim is the tower's width, hidden_size the merger's output (the text width)
        dict(embed_dim=32, hidden_size=64, mlp_ratio=2),
        "Qwen2VLForConditionalGeneration",
    ),
    VLCase(
        "qwen2_5_vl",
        "Qwen2_5_VLConfig",
        dict(rope_parameters=MROPE),
        dict(
            hidden_size=32,
            intermediate_size=64,
            out_hidden_size=64,
            hidden_act="silu",
            window_size=8,  # 8 pixels = 2 x 2 merged patches per window
            fullatt_block_indexes=[1],
            tokens_per_second=2,
        ),
        "Qwen2_5_VLForConditionalGeneration",
        seconds_per_grid=True,
        vision_ops=(("rms_norm", "standard"), ("swiglu_mlp", "standard")),
    ),
    VLCase(
        "qwen3_vl",
        "Qwen3VLConfig",
        dict(rope_parameters=dict(MROPE, mrope_interleaved=True)),
        dict(
            hidden_size=32,
            intermediate_size=64,
            out_hidden_size=64,
            num_position_embeddings=16,
            deepstack_visual_indexes=[0],
        ),
        "Qwen3VLForConditionalGeneration",
        npu_removes=[],
        frames_apart=True,
    ),
    VLCase(
        "qwen3_vl_moe",
        "Qwen3VLMoeConfig",
        dict(MOE_TEXT, rope_parameters=dict(MROPE, mrope_interleaved=True)),
        dict(
            hidden_size=32,
            intermediate_size=64,
            out_hidden_size=64,
            num_position_embeddings=16,
            deepstack_visual_indexes=[0],
        ),
        "Qwen3VLMoeForConditionalGeneration",
        moe=True,
        npu_removes=[],
        frames_apart=True,
    ),
]


def make_config(case: VLCase):
    """The composite config (text + vision), eager attention and eager experts (the moe guard lives in
    the eager experts forward)."""
    import transformers

    cls = getattr(transformers, case.config_class)
    text_cls = type(cls().get_text_config())
    fields = getattr(text_cls, "__dataclass_fields__", None)
    text = {k: v for k, v in dict(TEXT, **case.text).items() if fields is None or k in fields}
    config = cls(text_config=text, vision_config=dict(VISION, **case.vision), **TOKEN_IDS)
    config._attn_implementation = "eager"  # the setter reaches the sub-configs
    if case.moe:
        config._experts_implementation = "eager"
    return config


def patch_features(config) -> int:
    vision = config.vision_config
    return vision.in_channels * vision.temporal_patch_size * vision.patch_size**2


def _segments(case: VLCase, layout: List[Tuple[str, int]]) -> Tuple[List[int], List[int]]:
    """(ids, mm_token_type_ids) of a layout: ("text", n) random text tokens, ("image", 0) the image,
    ("video", 0) the video (Qwen3-VL: one group per frame, a text token between frames)."""
    ids: List[int] = []
    kinds: List[int] = []
    gen = torch.Generator().manual_seed(len(layout) * 31 + sum(n for _, n in layout))

    def text(n):
        ids.extend(torch.randint(1, TEXT_TOKENS, (n,), generator=gen).tolist())
        kinds.extend([0] * n)

    def vision(token, kind, tokens):
        ids.extend([VISION_START] + [token] * tokens + [VISION_END])
        kinds.extend([0] + [kind] * tokens + [0])

    for what, n in layout:
        if what == "text":
            text(n)
        elif what == "image":
            t, h, w = IMAGE_GRID
            vision(IMAGE, 1, t * h * w // MERGE**2)
        else:
            t, h, w = VIDEO_GRID
            if case.frames_apart:
                for _ in range(t):
                    text(1)  # the frame's timestamp
                    vision(VIDEO, 2, h * w // MERGE**2)
            else:
                vision(VIDEO, 2, t * h * w // MERGE**2)
    return ids, kinds


def pixels(config, grid: Tuple[int, int, int], seed: int) -> torch.Tensor:
    t, h, w = grid
    return torch.randn(t * h * w, patch_features(config), generator=torch.Generator().manual_seed(seed))


def make_inputs(
    case: VLCase, config, device: torch.device, video: bool = True, labels: bool = True
) -> Dict[str, torch.Tensor]:
    """Two rows, right-padded to one length with an attention mask: the first holds the image, the
    second the video (or the image again when `video` is False). Labels: the ids, -100 on padding and
    on vision placeholders."""
    first, first_kinds = _segments(case, [("text", 3), ("image", 0), ("text", 6)])
    second, second_kinds = _segments(case, [("text", 2), ("video" if video else "image", 0), ("text", 4)])
    length = max(len(first), len(second)) + 3  # the second row gets at least 3 padding tokens
    rows = []
    for row_ids, row_kinds in ((first, first_kinds), (second, second_kinds)):
        pad = length - len(row_ids)
        rows.append((row_ids + [0] * pad, row_kinds + [0] * pad, [1] * len(row_ids) + [0] * pad))
    input_ids = torch.tensor([r[0] for r in rows])
    kinds = torch.tensor([r[1] for r in rows])
    attention_mask = torch.tensor([r[2] for r in rows])
    out = dict(input_ids=input_ids, attention_mask=attention_mask, mm_token_type_ids=kinds)
    grids = [IMAGE_GRID, VIDEO_GRID if video else IMAGE_GRID]
    if video:
        out.update(
            pixel_values=pixels(config, IMAGE_GRID, 11),
            image_grid_thw=torch.tensor([IMAGE_GRID]),
            pixel_values_videos=pixels(config, VIDEO_GRID, 12),
            video_grid_thw=torch.tensor([VIDEO_GRID]),
        )
        if case.seconds_per_grid:
            out["second_per_grid_ts"] = torch.tensor([1.0])
    else:
        out.update(
            pixel_values=torch.cat([pixels(config, g, 11 + i) for i, g in enumerate(grids)]),
            image_grid_thw=torch.tensor(grids),
        )
    if labels:
        target = input_ids.clone()
        target[(attention_mask == 0) | (kinds != 0)] = -100
        out["labels"] = target
    return {k: v.to(device) for k, v in out.items()}


def image_prompt(case: VLCase, config, device: torch.device) -> Dict[str, torch.Tensor]:
    """A generation prompt: two rows, each text + an image + text, the second left-padded (decoder-only
    generation pads on the left)."""
    first, first_kinds = _segments(case, [("text", 2), ("image", 0), ("text", 3)])
    second, second_kinds = _segments(case, [("text", 1), ("image", 0), ("text", 1)])
    pad = len(first) - len(second)
    assert pad > 0
    input_ids = torch.tensor([first, [0] * pad + second])
    kinds = torch.tensor([first_kinds, [0] * pad + second_kinds])
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, :pad] = 0
    return {
        k: v.to(device)
        for k, v in dict(
            input_ids=input_ids,
            attention_mask=attention_mask,
            mm_token_type_ids=kinds,
            pixel_values=torch.cat([pixels(config, IMAGE_GRID, 21), pixels(config, IMAGE_GRID, 22)]),
            image_grid_thw=torch.tensor([IMAGE_GRID, IMAGE_GRID]),
        ).items()
    }


def vocab_size(config) -> int:
    return config.get_text_config().vocab_size
