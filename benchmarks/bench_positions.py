"""Benchmark: transformers' Qwen2-VL ``get_rope_index`` against ropeserve's M-RoPE position engine.

Both run in this process on the same CPU tensors, after warm-up, in alternating rounds; the table reports the
median (and best) time per call and their ratio (transformers / ropeserve). Outputs are asserted identical first.

    .venv/bin/python benchmarks/bench_positions.py [--repeats N] [--threads T] [--only NAME ...]

Workloads (issue #3; issue #17 adds the same prompts under other transformers modules' rules):
  * video+images: 8 rows x ~2.8k tokens, each row 4 images of 28x28 patches and one 8x16x16 video, left padding.
  * many-images:  8 rows x 64 images of 8x8 patches with text between them.
  * qwen3_5 video+images: the first workload under Qwen3.5's rule (each video frame its own block between
    6 timestamp tokens), against Qwen3_5Model.get_rope_index.
  * ernie video+images: the first workload under ERNIE-4.5-VL's rule (temporal merge 2), against
    Ernie4_5_VLMoeModel.get_rope_index.
  * omni audio+video+images: 8 rows, each 4 images, one 8x16x16 video carrying 30 s of audio (use_audio_in_video)
    and one 10 s audio clip, against Qwen2.5-Omni's get_rope_index.
  * qwen3_omni: the Omni workload under Qwen3-Omni's rule (float positions, audio merged with video by time).
  * glm_image: 8 rows with two 32x32 prompt images and one image to generate (prefill and decode positions).
  * hunyuan_vl: 8 rows with four 16x16 images (XD-RoPE, 4 axes).
  * minicpmv4_7: 8 rows with two images, each a thumbnail and a 2x3 grid of 448-pixel slices (64 tokens each,
    canvas M-RoPE).
"""

from __future__ import annotations

import argparse
import statistics
import time
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from transformers.models.ernie4_5_vl_moe.modeling_ernie4_5_vl_moe import Ernie4_5_VLMoeModel
from transformers.models.glm_image.modeling_glm_image import GlmImageModel
from transformers.models.hunyuan_vl.modeling_hunyuan_vl import HunYuanVLModel
from transformers.models.minicpmv4_7.modeling_minicpmv4_7 import MiniCPMV4_7Model
from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import Qwen2_5OmniPreTrainedModelForConditionalGeneration
from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLModel
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5Model
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
    Qwen3OmniMoePreTrainedModelForConditionalGeneration,
)

from ropeserve.positions import mrope_positions_from_segments, mrope_positions_from_tokens
from ropeserve.positions.glm_image import glm_image_positions
from ropeserve.positions.hunyuan_vl import hunyuan_vl_positions
from ropeserve.positions.minicpm_v import MiniCpmMarkers, minicpmv_positions
from ropeserve.positions.omni import omni_audio_tokens, omni_positions_from_tokens

MERGE = 2
IMAGE_ID, VIDEO_ID, TEXT_ID = 151655, 151656, 100


FRAME_GAP = 6
"""Qwen3.5 workload: timestamp text tokens between consecutive video frames."""
MODULES: dict[str, Any] = {"qwen2_vl": Qwen2VLModel, "qwen3_5": Qwen3_5Model, "ernie4_5_vl_moe": Ernie4_5_VLMoeModel}
VIDEO_T_MERGE = {"ernie4_5_vl_moe": 2}


@dataclass
class Workload:
    name: str
    module: str
    rows: list[list[dict[str, Any]]]
    input_ids: torch.Tensor
    mm_token_type_ids: torch.Tensor
    attention_mask: torch.Tensor
    image_grid_thw: torch.Tensor | None
    video_grid_thw: torch.Tensor | None


def _tokens(segment: dict[str, Any], module: str) -> list[int]:
    if "text" in segment:
        return [0] * segment["text"]
    kind, value = ("image", 1) if "image" in segment else ("video", 2)
    t, h, w = segment[kind]
    frame = [value] * ((h // MERGE) * (w // MERGE))
    if "frame_gaps" in segment:
        return [*frame, *([0] * FRAME_GAP + frame) * (t - 1)]
    return frame * (t // VIDEO_T_MERGE.get(module, 1) if kind == "video" else t)


def build_workload(name: str, rows: list[list[dict[str, Any]]], module: str = "qwen2_vl") -> Workload:
    """Render segment rows as a left-padded token batch with global grids (what a serving stack holds)."""
    if module == "qwen3_5":
        rows = [[{**s, "frame_gaps": FRAME_GAP} if "video" in s else s for s in row] for row in rows]
    type_rows = [[v for segment in row for v in _tokens(segment, module)] for row in rows]
    width = max(len(r) for r in type_rows)
    types_ = torch.zeros((len(rows), width), dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for b, row in enumerate(type_rows):
        types_[b, width - len(row) :] = torch.tensor(row)
        mask[b, width - len(row) :] = 1
    ids = torch.full_like(types_, TEXT_ID)
    ids[types_ == 1] = IMAGE_ID
    ids[types_ == 2] = VIDEO_ID
    images = [s["image"] for row in rows for s in row if "image" in s]
    videos = [s["video"] for row in rows for s in row if "video" in s]
    return Workload(
        name=name,
        module=module,
        rows=rows,
        input_ids=ids,
        mm_token_type_ids=types_,
        attention_mask=mask,
        image_grid_thw=torch.tensor(images) if images else None,
        video_grid_thw=torch.tensor(videos) if videos else None,
    )


def video_and_images(module: str = "qwen2_vl") -> Workload:
    rows = []
    for b in range(8):
        text = 250 - 4 * b  # rows differ in length -> left padding
        row: list[dict[str, Any]] = []
        for _ in range(4):
            row += [{"text": text}, {"image": [1, 28, 28]}]
        row += [{"text": text}, {"video": [8, 16, 16]}, {"text": 254}]
        rows.append(row)
    prefix = "" if module == "qwen2_vl" else f"{module} "
    return build_workload(f"{prefix}video+images (8 x ~2.8k)", rows, module)


def many_images() -> Workload:
    rows = []
    for b in range(8):
        row: list[dict[str, Any]] = []
        for i in range(64):
            row += [{"text": 8 + (i + b) % 5}, {"image": [1, 8, 8]}]
        row.append({"text": 6})
        rows.append(row)
    return build_workload("many-images (8 x 64 img)", rows)


def transformers_get_rope_index(w: Workload) -> tuple[torch.Tensor, torch.Tensor]:
    """``<Module>Model.get_rope_index`` called unbound on a stand-in ``self``."""
    model = MODULES[w.module]
    vision_config = types.SimpleNamespace(spatial_merge_size=MERGE, temporal_merge_size=VIDEO_T_MERGE.get(w.module, 1))
    stand_in = types.SimpleNamespace(config=types.SimpleNamespace(vision_config=vision_config))
    stand_in.get_vision_position_ids = types.MethodType(model.get_vision_position_ids, stand_in)
    return model.get_rope_index(
        stand_in,
        w.input_ids,
        w.mm_token_type_ids,
        image_grid_thw=w.image_grid_thw,
        video_grid_thw=w.video_grid_thw,
        attention_mask=w.attention_mask,
    )


def ropeserve_tokens(w: Workload) -> tuple[torch.Tensor, torch.Tensor]:
    result = mrope_positions_from_tokens(
        family=w.module,
        mm_token_type_ids=w.mm_token_type_ids,
        image_grid_thw=w.image_grid_thw,
        video_grid_thw=w.video_grid_thw,
        attention_mask=w.attention_mask,
        compat="transformers5",
    )
    return result.position_ids, result.mrope_position_deltas


def ropeserve_segments(w: Workload) -> tuple[torch.Tensor, torch.Tensor]:
    result = mrope_positions_from_segments(w.rows, family=w.module, padding_side="left", compat="transformers5")
    return result.position_ids, result.mrope_position_deltas


OMNI_MODEL = Qwen2_5OmniPreTrainedModelForConditionalGeneration
OMNI3_MODEL = Qwen3OmniMoePreTrainedModelForConditionalGeneration
OMNI_IDS = {"image": 151655, "video": 151656, "audio": 151646, "vision_start": 151652, "audio_start": 151647}


def omni_workload(audio_window: int | None = None) -> dict[str, Any]:
    """Token ids and inputs of the Omni workload (left padded), as the processor lays them out (``audio_window``:
    Qwen3-Omni's audio token count)."""
    rows, images, videos, audios = [], [], [], []
    for b in range(8):
        text = [TEXT_ID] * (120 - 4 * b)
        row: list[int] = []
        for _ in range(4):
            row += [*text, OMNI_IDS["vision_start"], *[OMNI_IDS["image"]] * 196, TEXT_ID]
            images.append([1, 28, 28])
        video, audio = [OMNI_IDS["video"]] * 512, [OMNI_IDS["audio"]] * omni_audio_tokens(3000, audio_window)
        row += [*text, OMNI_IDS["vision_start"], OMNI_IDS["audio_start"], *video, *audio, TEXT_ID, TEXT_ID]
        clip = [OMNI_IDS["audio"]] * omni_audio_tokens(1000, audio_window)
        row += [*text, OMNI_IDS["audio_start"], *clip, TEXT_ID, *text]
        videos.append([8, 16, 16])
        audios += [3000, 1000]
        rows.append(row)
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), TEXT_ID, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, row in enumerate(rows):
        ids[b, width - len(row) :], mask[b, width - len(row) :] = torch.tensor(row), 1
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "image_grid_thw": torch.tensor(images),
        "video_grid_thw": torch.tensor(videos),
        "second_per_grid_ts": torch.full((len(videos),), 2.0),
        "audio_seqlens": torch.tensor(audios),
    }


def _omni_get_rope_index(model: Any, w: dict[str, Any], **config: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """``model.get_rope_index`` unbound on a stand-in ``self`` (token ids above, pps 25, ``config`` extras)."""
    ids = {f"{name}_token_id": value for name, value in OMNI_IDS.items()}
    stand_in = types.SimpleNamespace(
        config=types.SimpleNamespace(**ids, position_id_per_seconds=25, **config), spatial_merge_size=MERGE
    )
    for helper in ("get_llm_pos_ids_for_vision", "get_chunked_index"):
        if hasattr(model, helper):
            setattr(stand_in, helper, types.MethodType(getattr(model, helper), stand_in))
    return model.get_rope_index(
        stand_in,
        w["input_ids"],
        image_grid_thw=w["image_grid_thw"],
        video_grid_thw=w["video_grid_thw"],
        attention_mask=w["attention_mask"],
        use_audio_in_video=True,
        audio_seqlens=w["audio_seqlens"],
        second_per_grids=w["second_per_grid_ts"],
    )


def transformers_omni(w: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    return _omni_get_rope_index(OMNI_MODEL, w, seconds_per_chunk=2)


def transformers_qwen3_omni(w: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    return _omni_get_rope_index(OMNI3_MODEL, w, audio_config=types.SimpleNamespace(n_window=50))


def ropeserve_omni(w: dict[str, Any], family: str = "qwen2_5_omni") -> tuple[torch.Tensor, torch.Tensor]:
    result = omni_positions_from_tokens(**w, use_audio_in_video=True, family=family)
    return result.position_ids, result.mrope_position_deltas


def glm_image_workload() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """8 rows: text, two 32x32-token prompt images between markers, text, and one 32x32 image to generate."""
    rows, grids = [], []
    for b in range(8):
        text = [TEXT_ID] * (100 + 5 * b)
        rows.append([*text, 16384, *[167855] * 1024, 16385, *text, 16384, *[167855] * 1024, 16385, *text, 16384])
        grids += [[1, 32, 32]] * 3
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), TEXT_ID, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, row in enumerate(rows):
        ids[b, width - len(row) :], mask[b, width - len(row) :] = torch.tensor(row), 1
    return ids, mask, torch.tensor(grids), torch.full((len(rows),), 3)


def hunyuan_workload() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """8 rows: 4 images of 16x16 merged patches (16 x 17 tokens with the row ends, plus 2 markers) between text."""
    rows = []
    for b in range(8):
        row: list[int] = []
        for _ in range(4):
            row += [0] * (200 - 4 * b) + [1] * (16 * 17 + 2)
        rows.append([*row, *[0] * 50])
    width = max(len(r) for r in rows)
    types_ = torch.zeros((len(rows), width), dtype=torch.long)
    mask = torch.zeros_like(types_)
    for b, row in enumerate(rows):
        types_[b, width - len(row) :], mask[b, width - len(row) :] = torch.tensor(row), 1
    return types_, mask, torch.tensor([[1, 32, 32]] * 32)


MINICPM_MARKERS = {"slice_start": 901, "slice_end": 902, "image_start": 903, "image_end": 904, "newline": 905}


def minicpm_workload() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """8 rows: 2 images, each an 8x8-token thumbnail and a 2x3 grid of 8x8-token slices, between text (the
    processor's 448-pixel slices: 32x32 patches of 14 pixels, 4x4 merged in ``16x`` mode)."""
    ids: list[int] = []
    sizes = []
    for _ in range(2):
        ids += [7] * 40 + [903, *[8] * 64, 904]
        for row in range(2):
            for _ in range(3):
                ids += [901, *[8] * 64, 902]
            ids += [905] if row == 0 else []
        sizes += [[32, 32]] * 7
    ids += [7] * 20
    ids_t = torch.tensor([ids] * 8)
    return ids_t, (ids_t == 8).long(), torch.tensor(sizes * 8)


def own_rule_workloads() -> list[tuple[str, int, Callable[[], tuple], Callable[[], tuple]]]:
    """``(name, tokens, transformers call, ropeserve call)`` of the families with their own position function."""
    omni, omni3 = omni_workload(), omni_workload(audio_window=50)
    ids, mask, grids, per_sample = glm_image_workload()
    glm_stand_in = types.SimpleNamespace(
        config=types.SimpleNamespace(image_start_token_id=16384, image_end_token_id=16385)
    )
    glm_stand_in.get_vision_position_ids = types.MethodType(GlmImageModel.get_vision_position_ids, glm_stand_in)

    def glm_reference() -> tuple:
        positions, deltas = GlmImageModel.get_rope_index(glm_stand_in, ids, grids, per_sample, mask)
        return positions, deltas, glm_stand_in._cached_decode_position_ids

    def glm_ours() -> tuple:
        result = glm_image_positions(
            input_ids=ids, image_grid_thw=grids, images_per_sample=per_sample, attention_mask=mask
        )
        return result.position_ids, result.mrope_position_deltas, result.decode_position_ids

    hy_types, hy_mask, hy_grids = hunyuan_workload()
    hy_config = types.SimpleNamespace(
        text_config=types.SimpleNamespace(rope_parameters={"mrope_section": [16, 16, 16, 16]}),
        vision_config=types.SimpleNamespace(spatial_merge_size=MERGE),
    )
    hy_stand_in = types.SimpleNamespace(config=hy_config)
    hy_stand_in.get_vision_position_ids = types.MethodType(HunYuanVLModel.get_vision_position_ids, hy_stand_in)

    def hy_reference() -> tuple:
        return HunYuanVLModel.get_rope_index(hy_stand_in, hy_types, hy_types, hy_grids, hy_mask)

    def hy_ours() -> tuple:
        result = hunyuan_vl_positions(mm_token_type_ids=hy_types, image_grid_thw=hy_grids, attention_mask=hy_mask)
        return result.position_ids, result.mrope_position_deltas

    mc_ids, mc_types, mc_sizes = minicpm_workload()
    mc_config = types.SimpleNamespace(
        downsample_mode="16x", **{f"{name}_id": value for name, value in MINICPM_MARKERS.items()}
    )
    mc_stand_in = types.SimpleNamespace(config=mc_config, _frame_end_idx=MiniCPMV4_7Model._frame_end_idx)
    for helper in ("_group_visual_frames", "get_vision_position_ids"):
        setattr(mc_stand_in, helper, types.MethodType(getattr(MiniCPMV4_7Model, helper), mc_stand_in))

    def mc_reference() -> tuple:
        return MiniCPMV4_7Model.get_rope_index(mc_stand_in, mc_ids, mc_types, mc_sizes)

    def mc_ours() -> tuple:
        result = minicpmv_positions(
            input_ids=mc_ids,
            mm_token_type_ids=mc_types,
            markers=MiniCpmMarkers(**MINICPM_MARKERS),
            target_sizes=mc_sizes,
        )
        return result.position_ids, result.mrope_position_deltas

    return [
        ("minicpmv4_7 2 images x (thumb + 2x3 slices)", int(mc_ids.numel()), mc_reference, mc_ours),
        (
            "omni audio+video+images (8 rows)",
            int(omni["attention_mask"].sum()),
            lambda: transformers_omni(omni),
            lambda: ropeserve_omni(omni),
        ),
        (
            "qwen3_omni audio+video+images (8 rows)",
            int(omni3["attention_mask"].sum()),
            lambda: transformers_qwen3_omni(omni3),
            lambda: ropeserve_omni(omni3, "qwen3_omni_moe"),
        ),
        ("glm_image 2 prompt images + 1 to generate", int(mask.sum()), glm_reference, glm_ours),
        ("hunyuan_vl 4 images (8 rows)", int(hy_mask.sum()), hy_reference, hy_ours),
    ]


def interleaved_medians(
    implementations: dict[str, Callable[[], object]], repeats: int, inner: dict[str, int]
) -> dict[str, tuple[float, float]]:
    """(median, best) seconds per call of each implementation.

    Rounds alternate between the implementations, so that load from other processes hits them alike; within a
    round an implementation runs ``inner[name]`` times (fast ones more often) and the per-call mean is one sample.
    """
    for fn in implementations.values():  # warm-up
        for _ in range(3):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in implementations}
    for _ in range(repeats):
        for name, fn in implementations.items():
            start = time.perf_counter()
            for _ in range(inner[name]):
                fn()
            samples[name].append((time.perf_counter() - start) / inner[name])
    return {name: (statistics.median(values), min(values)) for name, values in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=25, help="timed rounds per implementation (median reported)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    parser.add_argument(
        "--only", nargs="+", default=None, metavar="NAME", help="run only the workloads whose name contains NAME"
    )
    args = parser.parse_args()

    def selected(name: str) -> bool:
        return args.only is None or any(part in name for part in args.only)

    torch.set_num_threads(args.threads)

    print(f"torch {torch.__version__}, threads={torch.get_num_threads()}, median (best) of {args.repeats} rounds")
    header = f"{'workload':<42}{'tokens':>7}{'transformers ms':>22}{'ropeserve ms':>19}{'ratio':>14}{'segments ms':>13}"
    print(header)
    print("-" * len(header))
    ratios = []
    for workload in (
        video_and_images(),
        many_images(),
        video_and_images("qwen3_5"),
        video_and_images("ernie4_5_vl_moe"),
    ):
        if not selected(workload.name):
            continue
        expected = transformers_get_rope_index(workload)
        for implementation in (ropeserve_tokens, ropeserve_segments):
            got = implementation(workload)
            assert torch.equal(got[0], expected[0]), f"{implementation.__name__}: position_ids differ"
            assert torch.equal(got[1], expected[1]), f"{implementation.__name__}: deltas differ"
        timings = interleaved_medians(
            {
                "transformers": lambda w=workload: transformers_get_rope_index(w),
                "ropeserve": lambda w=workload: ropeserve_tokens(w),
                "segments": lambda w=workload: ropeserve_segments(w),
            },
            args.repeats,
            {"transformers": 1, "ropeserve": 5, "segments": 2},
        )
        (hf, hf_best), (ours, ours_best), (segments, _) = timings.values()
        ratios.append(hf / ours)
        tokens = int(workload.attention_mask.sum())
        print(
            f"{workload.name:<42}{tokens:>7}{hf * 1e3:>13.2f} ({hf_best * 1e3:5.2f}){ours * 1e3:>11.3f} "
            f"({ours_best * 1e3:5.3f}){hf / ours:>6.1f}x ({hf_best / ours_best:4.1f}x){segments * 1e3:>11.3f}"
        )
    for name, tokens, reference, ours_fn in own_rule_workloads():
        if not selected(name):
            continue
        expected, got = reference(), ours_fn()
        assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True)), f"{name}: outputs differ"
        timings = interleaved_medians(
            {"transformers": reference, "ropeserve": ours_fn}, args.repeats, {"transformers": 1, "ropeserve": 3}
        )
        (hf, hf_best), (ours, ours_best) = timings.values()
        ratios.append(hf / ours)
        print(
            f"{name:<42}{tokens:>7}{hf * 1e3:>13.2f} ({hf_best * 1e3:5.2f}){ours * 1e3:>11.3f} "
            f"({ours_best * 1e3:5.3f}){hf / ours:>6.1f}x ({hf_best / ours_best:4.1f}x){'-':>11}"
        )
    print("outputs identical: yes; ratio = transformers / ropeserve (token form); goal >= 10x on all:", end=" ")
    print("met" if min(ratios) >= 10 else "NOT met")


if __name__ == "__main__":
    main()
