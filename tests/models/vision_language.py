"""The vision-language and omni models of the real-model tests (issue 31): their cases, tiny random configs
and real multimodal inputs, shared by tests/models/e2e.py (which checks each against upstream on the CPU
in CI, on the GPU with opslot's `cuda` kernels, and in `make matrix`) and tests/models/test_vision_language.py
(generation, checkpoints, packing, the towers' slots).

A model here is its processor-facing `*ForConditionalGeneration` (the class public checkpoints load
into; for Qwen2.5-Omni and Qwen3-Omni-MoE their Thinker, the part that is trained), fed what the model's
processor produces:
`input_ids` with the vision placeholders (`<|vision_start|>`, one placeholder token per merged patch,
`<|vision_end|>`), `mm_token_type_ids` (0 text, 1 image, 2 video: the 3-D RoPE positions are computed
from them), `pixel_values` + `image_grid_thw` (patches flattened to
`in_channels * temporal_patch_size * patch_size**2` features) and `pixel_values_videos` +
`video_grid_thw` (Qwen2.5-VL also `second_per_grid_ts`). Qwen3-VL's processor writes each video frame
as its own group (a timestamp, then `<|vision_start|>` frame `<|vision_end|>`), and its RoPE index
splits the video grid per frame: the inputs follow that. The omni Thinkers also take audio:
`input_features` (log-mel frames) + `feature_attention_mask`, one `<|AUDIO|>` placeholder per encoder
output frame between `<|audio_bos|>` and `<|audio_eos|>`; they find the modalities from the ids (no
`mm_token_type_ids`) and take `video_second_per_grid`. Labels are the ids, -100 on padding and on the
placeholders (what a training collator does).

This module imports nothing from the tests (e2e.py imports it).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional, Tuple

import torch

#: Token ids of the tiny configs (inside the vocabulary of 256); text tokens are drawn below 240.
IMAGE, VIDEO, VISION_START, VISION_END = 250, 251, 252, 253
AUDIO, AUDIO_START, AUDIO_END = 249, 246, 247
TEXT_TOKENS = 240
TOKEN_IDS = dict(
    image_token_id=IMAGE, video_token_id=VIDEO, vision_start_token_id=VISION_START, vision_end_token_id=VISION_END
)
#: Qwen2.5-Omni's Thinker's names for them (its config maps `*_token_index` to `*_token_id`).
OMNI_TOKEN_IDS = dict(
    image_token_index=IMAGE,
    video_token_index=VIDEO,
    audio_token_index=AUDIO,
    vision_start_token_id=VISION_START,
    vision_end_token_id=VISION_END,
    audio_start_token_id=AUDIO_START,
    audio_end_token_id=AUDIO_END,
)
#: Qwen3-Omni's Thinker's names for them.
OMNI3_TOKEN_IDS = dict(
    image_token_id=IMAGE,
    video_token_id=VIDEO,
    audio_token_id=AUDIO,
    vision_start_token_id=VISION_START,
    vision_end_token_id=VISION_END,
    audio_start_token_id=AUDIO_START,
    audio_end_token_id=AUDIO_END,
)
#: The kind of each token (mm_token_type_ids; the omni Thinker takes none, AUDIO_KIND marks its labels).
TEXT_KIND, IMAGE_KIND, VIDEO_KIND, AUDIO_KIND = 0, 1, 2, 3

#: The image and the video of every input: (t, h, w) in patches. With spatial_merge_size 2, the image
#: is 2 x 4 = 8 placeholder tokens (Qwen2.5-VL's window of 2 x 2 merged patches splits it in two
#: windows), the video 2 frames of 2 x 2 = 8 tokens.
IMAGE_GRID = (1, 4, 8)
VIDEO_GRID = (2, 4, 4)
MERGE = 2
#: The audio: log-mel frames of 16 bins. Qwen2.5-Omni's encoder (a stride-2 convolution, then pooling)
#: makes 4 placeholder tokens of 16 frames; Qwen3-Omni's (chunks of 2 x n_window frames, three stride-2
#: convolutions) 13 of one 100-frame chunk.
AUDIO_BINS = 16

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
    config_class: str  # transformers.<name>: the composite (text + vision [+ audio]) config
    text: Dict[str, Any]  # the text config (added to TEXT)
    vision: Dict[str, Any]  # the vision config (added to VISION)
    causal_lm: str  # the *ForConditionalGeneration: the model checked against upstream
    moe: bool = False  # forward with output_router_logits=True (reaches load_balancing_loss_func)
    npu_removes: Optional[List[str]] = None  # None: no NPU sibling; else the slots it removes
    frames_apart: bool = False  # the processor writes each video frame as its own group (Qwen3-VL)
    video_seconds: Optional[str] = None  # the forward's seconds-per-grid argument for videos, if any
    #: (op, variant, class) of the slots the vision tower itself dispatches: one call per module of the
    #: class per tower call (test_vision_language.py runs the tower alone and counts them)
    vision_ops: Tuple[Tuple[str, str, str], ...] = ()
    audio: Optional[Dict[str, Any]] = None  # the audio encoder's config (omni): the inputs hold an audio
    audio_frames: int = 16  # log-mel frames of the audio
    audio_tokens: int = 4  # the placeholder tokens the audio encoder makes of them
    tokens: Dict[str, int] = dataclasses.field(default_factory=lambda: dict(TOKEN_IDS))
    mm_token_types: bool = True  # the forward takes mm_token_type_ids (the omni Thinker reads the ids)
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
#: A Qwen2.5-VL-style vision encoder (RMSNorm, gated SiLU MLP with biases, windowed attention).
WINDOWED_VISION = dict(
    hidden_size=32,
    intermediate_size=64,
    out_hidden_size=64,
    hidden_act="silu",
    window_size=8,  # 8 pixels = 2 x 2 merged patches per window
    fullatt_block_indexes=[1],
)
#: A Qwen3-VL-style vision encoder (LayerNorm, GELU MLP, learned positions, deepstack).
DEEPSTACK_VISION = dict(
    hidden_size=32,
    intermediate_size=64,
    out_hidden_size=64,
    num_position_embeddings=16,
    deepstack_visual_indexes=[0],
)
#: Qwen2.5-Omni's audio encoder: 16 mel bins, one layer; n_window 4 (chunks of 8 frames).
OMNI_AUDIO = dict(
    num_mel_bins=AUDIO_BINS,
    encoder_layers=1,
    encoder_attention_heads=2,
    encoder_ffn_dim=64,
    d_model=32,
    output_dim=64,
    n_window=4,
    max_source_positions=64,
)
#: Qwen3-Omni's audio encoder: 16 mel bins, one layer, chunks of 100 frames, a 16-channel downsampler.
OMNI3_AUDIO = dict(
    num_mel_bins=AUDIO_BINS,
    encoder_layers=1,
    encoder_attention_heads=2,
    encoder_ffn_dim=64,
    d_model=32,
    output_dim=64,
    n_window=50,
    n_window_infer=100,
    conv_chunksize=500,
    downsample_hidden_size=16,
    max_source_positions=64,
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
        dict(WINDOWED_VISION, tokens_per_second=2),
        "Qwen2_5_VLForConditionalGeneration",
        video_seconds="second_per_grid_ts",
        vision_ops=(("rms_norm", "standard", "Qwen2_5_VLRMSNorm"), ("swiglu_mlp", "standard", "Qwen2_5_VLMLP")),
    ),
    VLCase(
        "qwen3_vl",
        "Qwen3VLConfig",
        dict(rope_parameters=dict(MROPE, mrope_interleaved=True)),
        DEEPSTACK_VISION,
        "Qwen3VLForConditionalGeneration",
        npu_removes=[],
        frames_apart=True,
    ),
    VLCase(
        "qwen3_vl_moe",
        "Qwen3VLMoeConfig",
        dict(MOE_TEXT, rope_parameters=dict(MROPE, mrope_interleaved=True)),
        DEEPSTACK_VISION,
        "Qwen3VLMoeForConditionalGeneration",
        moe=True,
        fp32_router=True,
        npu_removes=[],
        frames_apart=True,
    ),
    VLCase(
        "qwen2_5_omni",
        "Qwen2_5OmniThinkerConfig",
        dict(rope_parameters=MROPE),
        WINDOWED_VISION,
        "Qwen2_5OmniThinkerForConditionalGeneration",
        video_seconds="video_second_per_grid",
        vision_ops=(("rms_norm", "standard", "Qwen2_5OmniRMSNorm"), ("swiglu_mlp", "standard", "Qwen2_5OmniMLP")),
        audio=OMNI_AUDIO,
        tokens=OMNI_TOKEN_IDS,
        mm_token_types=False,
    ),
    VLCase(
        "qwen3_omni_moe",
        "Qwen3OmniMoeThinkerConfig",
        dict(MOE_TEXT, rope_parameters=dict(MROPE, mrope_interleaved=True)),
        DEEPSTACK_VISION,
        "Qwen3OmniMoeThinkerForConditionalGeneration",
        moe=True,
        fp32_router=True,
        npu_removes=[],
        video_seconds="video_second_per_grid",
        audio=OMNI3_AUDIO,
        audio_frames=100,
        audio_tokens=13,
        tokens=OMNI3_TOKEN_IDS,
        mm_token_types=False,
    ),
]


def make_config(case: VLCase):
    """The composite config (text + vision [+ audio]), eager attention and eager experts (the moe guard
    lives in the eager experts forward)."""
    import transformers

    cls = getattr(transformers, case.config_class)
    text_cls = type(cls().get_text_config())
    fields = getattr(text_cls, "__dataclass_fields__", None)
    text = {k: v for k, v in dict(TEXT, **case.text).items() if fields is None or k in fields}
    towers = dict(vision_config=dict(VISION, **case.vision))
    if case.audio is not None:
        towers["audio_config"] = dict(case.audio)
    config = cls(text_config=text, **towers, **case.tokens)
    config._attn_implementation = "eager"  # the setter reaches the sub-configs
    if case.moe:
        config._experts_implementation = "eager"
    return config


def patch_features(config) -> int:
    vision = config.vision_config
    return vision.in_channels * vision.temporal_patch_size * vision.patch_size**2


def _segments(case: VLCase, layout: List[Tuple[str, int]]) -> Tuple[List[int], List[int]]:
    """(ids, kinds) of a layout: ("text", n) random text tokens, ("image", 0) the image, ("video", 0) the
    video (Qwen3-VL: one group per frame, a text token between frames), ("audio", 0) the audio; kinds are
    the mm_token_type_ids (TEXT_KIND ...; AUDIO_KIND for the audio placeholders)."""
    ids: List[int] = []
    kinds: List[int] = []
    gen = torch.Generator().manual_seed(len(layout) * 31 + sum(n for _, n in layout))

    def text(n):
        ids.extend(torch.randint(1, TEXT_TOKENS, (n,), generator=gen).tolist())
        kinds.extend([TEXT_KIND] * n)

    def placeholders(token, kind, count, start=VISION_START, end=VISION_END):
        ids.extend([start] + [token] * count + [end])
        kinds.extend([TEXT_KIND] + [kind] * count + [TEXT_KIND])

    for what, n in layout:
        if what == "text":
            text(n)
        elif what == "audio":
            placeholders(AUDIO, AUDIO_KIND, case.audio_tokens, AUDIO_START, AUDIO_END)
        elif what == "image":
            t, h, w = IMAGE_GRID
            placeholders(IMAGE, IMAGE_KIND, t * h * w // MERGE**2)
        else:
            t, h, w = VIDEO_GRID
            if case.frames_apart:
                for _ in range(t):
                    text(1)  # the frame's timestamp
                    placeholders(VIDEO, VIDEO_KIND, h * w // MERGE**2)
            else:
                placeholders(VIDEO, VIDEO_KIND, t * h * w // MERGE**2)
    return ids, kinds


def pixels(config, grid: Tuple[int, int, int], seed: int) -> torch.Tensor:
    t, h, w = grid
    return torch.randn(t * h * w, patch_features(config), generator=torch.Generator().manual_seed(seed))


def audio_features(case: VLCase, count: int, seed: int) -> Dict[str, torch.Tensor]:
    """`count` audios of the case's log-mel frames: input_features [count, bins, frames] and the mask."""
    frames = case.audio_frames
    features = torch.randn(count, AUDIO_BINS, frames, generator=torch.Generator().manual_seed(seed))
    return dict(input_features=features, feature_attention_mask=torch.ones(count, frames, dtype=torch.long))


def _rows(rows: List[Tuple[List[int], List[int]]], left: bool, extra: int = 0) -> Dict[str, torch.Tensor]:
    """Rows padded with token 0 to the longest row's length + `extra` (on the right, or on the left for
    generation): input_ids, attention_mask and the tokens' kinds."""
    length = max(len(ids) for ids, _ in rows) + extra
    out: Dict[str, List[List[int]]] = {"input_ids": [], "attention_mask": [], "kinds": []}
    for ids, kinds in rows:
        pad = [0] * (length - len(ids))
        mask = [1] * len(ids)
        out["input_ids"].append(pad + ids if left else ids + pad)
        out["kinds"].append(pad + kinds if left else kinds + pad)
        out["attention_mask"].append(pad + mask if left else mask + pad)
    return {k: torch.tensor(v) for k, v in out.items()}


def _finish(case: VLCase, batch: Dict[str, torch.Tensor], labels: bool, device) -> Dict[str, torch.Tensor]:
    kinds = batch.pop("kinds")
    if case.mm_token_types:
        batch["mm_token_type_ids"] = kinds
    if labels:
        target = batch["input_ids"].clone()
        target[(batch["attention_mask"] == 0) | (kinds != TEXT_KIND)] = -100
        batch["labels"] = target
    return {k: v.to(device) for k, v in batch.items()}


def make_inputs(
    case: VLCase, config, device: torch.device, video: bool = True, labels: bool = True
) -> Dict[str, torch.Tensor]:
    """Two rows, right-padded with an attention mask (every row by at least 3 tokens): the first holds the image (and, for an omni model, the audio after it), the second
    the video (or the image again when `video` is False). Labels: the ids, -100 on padding and on the
    placeholders."""
    first = [("text", 3), ("image", 0), ("text", 6)]
    if case.audio is not None:
        first += [("audio", 0), ("text", 2)]
    second = [("text", 2), ("video" if video else "image", 0), ("text", 4)]
    batch = _rows([_segments(case, first), _segments(case, second)], left=False, extra=3)
    if video:
        batch.update(
            pixel_values=pixels(config, IMAGE_GRID, 11),
            image_grid_thw=torch.tensor([IMAGE_GRID]),
            pixel_values_videos=pixels(config, VIDEO_GRID, 12),
            video_grid_thw=torch.tensor([VIDEO_GRID]),
        )
        if case.video_seconds:
            batch[case.video_seconds] = torch.tensor([1.0])
    else:
        batch.update(
            pixel_values=torch.cat([pixels(config, IMAGE_GRID, 11), pixels(config, IMAGE_GRID, 12)]),
            image_grid_thw=torch.tensor([IMAGE_GRID, IMAGE_GRID]),
        )
    if case.audio is not None:
        batch.update(audio_features(case, 1, 13))
    return _finish(case, batch, labels, device)


def document(case: VLCase, config, layout, device, seed: int) -> Dict[str, torch.Tensor]:
    """One row of one document (its layout as for `_segments`, images only), labels the ids (-100 on
    placeholders), with its image's pixels and grid, its audio's features."""
    batch = _rows([_segments(case, layout)], left=False)
    images = sum(1 for what, _ in layout if what == "image")
    batch.update(
        pixel_values=torch.cat([pixels(config, IMAGE_GRID, seed + i) for i in range(images)]),
        image_grid_thw=torch.tensor([IMAGE_GRID] * images),
    )
    audios = sum(1 for what, _ in layout if what == "audio")
    if audios:
        batch.update(audio_features(case, audios, seed))
    return _finish(case, batch, True, device)


def image_prompt(case: VLCase, config, device: torch.device) -> Dict[str, torch.Tensor]:
    """A generation prompt: two rows, each text + an image + text, the second left-padded (decoder-only
    generation pads on the left)."""
    rows = [
        _segments(case, [("text", 2), ("image", 0), ("text", 3)]),
        _segments(case, [("text", 1), ("image", 0), ("text", 1)]),
    ]
    batch = _rows(rows, left=True)
    assert int(batch["attention_mask"][1].sum()) < batch["input_ids"].shape[1]  # the second row is padded
    batch.update(
        pixel_values=torch.cat([pixels(config, IMAGE_GRID, 21), pixels(config, IMAGE_GRID, 22)]),
        image_grid_thw=torch.tensor([IMAGE_GRID, IMAGE_GRID]),
    )
    return _finish(case, batch, False, device)


def rope_index(case: VLCase, model, inputs: Dict[str, torch.Tensor]) -> torch.Tensor:
    """The 3-D position ids [3, batch, seq] the model computes for `inputs` (its own `get_rope_index`:
    on the multimodal `*Model` of the VL models, on the omni Thinker itself)."""
    owner = model if hasattr(model, "get_rope_index") else model.model
    grids = {k: inputs[k] for k in ("image_grid_thw", "video_grid_thw") if k in inputs}
    if case.mm_token_types:
        if case.video_seconds and case.video_seconds in inputs:
            grids["second_per_grid_ts"] = inputs[case.video_seconds]
        positions, _ = owner.get_rope_index(
            inputs["input_ids"],
            mm_token_type_ids=inputs["mm_token_type_ids"],
            attention_mask=inputs.get("attention_mask"),
            **grids,
        )
    else:
        if "feature_attention_mask" in inputs:
            grids["audio_seqlens"] = inputs["feature_attention_mask"].sum(-1)
        if case.video_seconds and case.video_seconds in inputs:
            grids["second_per_grids"] = inputs[case.video_seconds]
        positions, _ = owner.get_rope_index(inputs["input_ids"], attention_mask=inputs.get("attention_mask"), **grids)
    return positions


def towers(model) -> Dict[str, torch.nn.Module]:
    """The model's towers by name: `language`, `visual`, and `audio` for an omni Thinker (5.17 holds them
    on the Thinker itself, from 5.23 on its `*ThinkerModel`)."""
    inner = model.model
    found = {"language": getattr(inner, "language_model", inner)}
    for name, attr in (("visual", "visual"), ("audio", "audio_tower")):
        tower = getattr(inner, attr, None) or getattr(model, attr, None)
        if tower is not None:
            found[name] = tower
    return found


def vocab_size(config) -> int:
    return config.get_text_config().vocab_size
