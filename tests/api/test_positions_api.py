"""Position endpoints: wiring to the position engine, transformers parity over HTTP, errors naming the input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from fastapi.testclient import TestClient
from positions_oracle import hf_get_rope_index, render_tokens
from safetensors.torch import load

from ropeserve.api import create_app
from ropeserve.api.routes_positions import preset_vision_config
from ropeserve.config import normalize_config, preset_config
from ropeserve.rope import mrope_cos_sin, vision_cos_sin
from ropeserve.settings import Settings

ROWS = [
    [{"text": 3}, {"image": [1, 4, 6]}, {"text": 2}, {"video": [4, 4, 8], "second_per_grid_t": 0.5}, {"text": 4}],
    [{"text": 5}, {"video": [2, 6, 4], "second_per_grid_t": 1.25}, {"text": 0}, {"image": [1, 2, 2]}, {"text": 1}],
]
SAFETENSORS = {"accept": "application/x-safetensors"}
CONFIGS = Path(__file__).resolve().parents[1] / "fixtures" / "configs"


@pytest.fixture(scope="module")
def client() -> TestClient:
    with TestClient(create_app(Settings(access_log=False, max_positions=10_000))) as test_client:
        yield test_client


def post(client: TestClient, path: str, body: dict, status: int = 200) -> dict:
    response = client.post(path, json=body)
    assert response.status_code == status, response.text
    return response.json()


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl"])
def test_segment_form_equals_transformers_get_rope_index(client: TestClient, family: str) -> None:
    body = post(client, "/v1/mrope/positions", {"family": family, "rows": ROWS, "padding_side": "left"})
    batch = render_tokens(ROWS, family, 2, left=True)
    expected_ids, expected_deltas = hf_get_rope_index(family, input_ids=batch.input_ids, **batch.kwargs())
    assert torch.equal(torch.tensor(body["position_ids"]), expected_ids)
    assert torch.equal(torch.tensor(body["mrope_position_deltas"]), expected_deltas)


def test_qwen3_5_config_gets_its_positions_from_the_family_table(client: TestClient) -> None:
    """The Qwen3.5 fixture (model_type qwen3_5, interleaved M-RoPE) through /v1/mrope/positions: 200 and
    transformers' Qwen3_5Model.get_rope_index; cos/sin already accepted the same config."""
    config = json.loads((CONFIGS / "Qwen__Qwen3.5-0.8B.json").read_text(encoding="utf-8"))
    rows = [
        [{"text": 3}, {"image": [1, 4, 6]}, {"text": 2}, {"video": [3, 4, 8], "frame_gaps": 2}, {"text": 4}],
        [{"text": 5}, {"video": [2, 6, 4], "frame_gaps": [1]}, {"text": 0}, {"image": [1, 2, 2]}, {"text": 1}],
    ]
    body = post(client, "/v1/mrope/positions", {"config": config, "rows": rows, "padding_side": "left"})
    batch = render_tokens(rows, "qwen3_5", 2, left=True)
    expected_ids, expected_deltas = hf_get_rope_index("qwen3_5", input_ids=batch.input_ids, **batch.kwargs())
    assert torch.equal(torch.tensor(body["position_ids"]), expected_ids)
    assert torch.equal(torch.tensor(body["mrope_position_deltas"]), expected_deltas)


def test_token_form_equals_segment_form_and_safetensors_equals_json(client: TestClient) -> None:
    batch = render_tokens(ROWS, "qwen2_5_vl", 2, left=True)
    token_body = {
        "preset": "qwen2.5-vl-7b",
        "input_ids": batch.input_ids.tolist(),
        "attention_mask": batch.attention_mask.tolist(),
        "image_grid_thw": batch.image_grid_thw.tolist(),
        "video_grid_thw": batch.video_grid_thw.tolist(),
        "second_per_grid_ts": batch.second_per_grid_ts.tolist(),
    }
    from_tokens = post(client, "/v1/mrope/positions", token_body)
    from_segments = post(
        client, "/v1/mrope/positions", {"preset": "qwen2.5-vl-7b", "rows": ROWS, "padding_side": "left"}
    )
    assert from_tokens["position_ids"] == from_segments["position_ids"]
    binary = load(client.post("/v1/mrope/positions", json=token_body, headers=SAFETENSORS).content)
    assert binary["position_ids"].tolist() == from_tokens["position_ids"]
    segment_body = {"preset": "qwen2.5-vl-7b", "rows": ROWS, "padding_side": "left", "context_len": 3, "seq_len": 9}
    sliced = post(client, "/v1/mrope/positions", segment_body)
    assert sliced["position_ids"] == [[row[3:9] for row in axis] for axis in from_tokens["position_ids"]]
    binary = load(client.post("/v1/mrope/positions", json=segment_body, headers=SAFETENSORS).content)
    assert binary["position_ids"].dtype == binary["mrope_position_deltas"].dtype == torch.int64
    assert binary["position_ids"].tolist() == sliced["position_ids"]
    assert binary["mrope_position_deltas"].tolist() == from_tokens["mrope_position_deltas"]


def test_compat_choices_differ_only_after_a_video(client: TestClient) -> None:
    rows = [[{"text": 1}, {"video": [4, 4, 4]}, {"text": 3}]]
    v5 = post(client, "/v1/mrope/positions", {"family": "qwen2_vl", "rows": rows, "compat": "transformers5"})
    v4 = post(client, "/v1/mrope/positions", {"family": "qwen2_vl", "rows": rows, "compat": "transformers4"})
    assert v5["position_ids"][0][0][-3:] == [3, 4, 5]  # start + max(h, w)/merge (spec §5.3 example C)
    assert v4["position_ids"][0][0][-3:] == [5, 6, 7]  # max position + 1
    assert v5["position_ids"][0][0][:-3] == v4["position_ids"][0][0][:-3]


def test_decode_continues_the_prefill_and_chunks_slice_it(client: TestClient) -> None:
    prefill = post(
        client,
        "/v1/mrope/positions",
        {"family": "qwen2_vl", "rows": [[{"text": 3}, {"image": [1, 4, 6]}, {"text": 2}]]},
    )
    delta, length = prefill["mrope_position_deltas"][0][0], len(prefill["position_ids"][0][0])
    decode = post(
        client,
        "/v1/mrope/decode-positions",
        {"mrope_position_deltas": [delta], "cache_lengths": [length], "num_new": 2},
    )
    last = prefill["position_ids"][0][0][-1]
    assert decode["position_ids"] == [[[last + 1, last + 2]]] * 3
    chunk = post(
        client,
        "/v1/mrope/positions",
        {
            "family": "qwen2_vl",
            "rows": [[{"text": 3}, {"image": [1, 4, 6]}, {"text": 2}]],
            "context_len": 4,
            "seq_len": 9,
        },
    )
    assert chunk["position_ids"] == [[axis[0][4:9]] for axis in prefill["position_ids"]]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"family": "qwen2_vl", "rows": [[{"image": [1, 4, 5]}]]}, "rows[0].segments[0]"),
        ({"family": "qwen2_vl", "rows": [[{"text": 2}], [{"text": 1}, {"movie": [1, 2, 2]}]]}, "rows[1].segments[1]"),
        ({"family": "nope", "rows": [[{"text": 2}]]}, "family"),
        ({"rows": [[{"text": 2}]]}, "family"),
        ({"family": "qwen2_vl", "mm_token_type_ids": [[0, 1, 1, 0]], "image_grid_thw": [[1, 4, 4]]}, None),
    ],
)
def test_inconsistent_input_is_422_naming_row_and_segment(client: TestClient, body: dict, field: str | None) -> None:
    problem = post(client, "/v1/mrope/positions", body, status=422)
    if field is not None:
        assert problem["field"] == field
    assert problem["detail"]


def test_one_dimensional_modes(client: TestClient) -> None:
    padded = post(client, "/v1/positions", {"attention_mask": [[0, 0, 1, 1], [1, 1, 1, 0]], "past_lengths": [2, 0]})
    assert padded["positions"] == [[0, 0, 2, 3], [0, 1, 2, 0]]
    packed = post(client, "/v1/positions", {"cu_seqlens": [0, 3, 5]})
    assert packed["positions"] == [0, 1, 2, 0, 1]
    decode = post(client, "/v1/positions", {"cache_lengths": [4], "num_new": 3})
    assert decode["positions"] == [[4, 5, 6]]
    post(client, "/v1/positions", {"cache_lengths": [4], "segment_lengths": [2]}, status=422)
    assert post(client, "/v1/positions", {"cache_lengths": [1], "num_new": 20_000}, status=422)["field"] == "num_new"


def test_packed_lengths_summing_past_int64_are_a_422_not_a_crash(client: TestClient) -> None:
    """The int64 sum of these lengths wraps (to -2**63: a 500 before; to 0: numpy's repeat crashed the server)."""
    for lengths in ([2**62, 2**62], [2**62] * 4):
        problem = post(client, "/v1/positions", {"segment_lengths": lengths}, status=422)
        assert problem["field"] == "segment_lengths" and problem["limit"] == 10_000


def test_mrope_cos_sin_matches_the_library(client: TestClient) -> None:
    ids = [[0, 1, 2, 3, 3], [0, 1, 2, 3, 4], [0, 1, 2, 4, 3]]
    body = post(client, "/v1/mrope/cos-sin", {"preset": "qwen3-vl-8b", "position_ids": ids, "dtype": "bfloat16"})
    params = normalize_config(preset_config("qwen3-vl-8b")).params()
    expected = mrope_cos_sin(params, torch.tensor(ids), dtype=torch.bfloat16)
    assert torch.equal(torch.tensor(body["cos"], dtype=torch.bfloat16), expected.cos)
    assert body["mrope_layout"] == "interleaved" and body["max_abs_error"] > 0
    assert (
        post(client, "/v1/mrope/cos-sin", {"preset": "llama-3.1-8b", "position_ids": ids}, status=422)["field"]
        == "rope"
    )


def test_vision_rope_reads_the_head_size_from_the_preset(client: TestClient) -> None:
    body = post(client, "/v1/vision/rope", {"preset": "qwen2.5-vl-7b", "grid_thw": [[2, 4, 6]]})
    assert body["head_dim"] == 1280 // 16 and body["tokens"] == 48
    cos, _ = vision_cos_sin(torch.tensor(body["hw_ids"]), 80)
    assert torch.equal(torch.tensor(body["cos"]), cos)
    assert post(client, "/v1/vision/rope", {"grid_thw": [[1, 4, 4]]}, status=422)["field"] == "head_dim"


def test_qwen3_5_config_gives_mrope_positions_equal_to_its_get_rope_index(client: TestClient) -> None:
    """The Qwen3.5 config that /v1/rope/cos-sin accepts was a 422 "unknown M-RoPE family 'qwen3_5'" here."""
    import json
    from pathlib import Path

    config = json.loads((Path(__file__).parents[1] / "fixtures/configs/Qwen__Qwen3.5-0.8B.json").read_text())
    rows = [[{"text": 3}, {"image": [1, 4, 6]}, {"text": 2}, {"video": [2, 4, 4], "frame_gaps": 3}, {"text": 1}]]
    batch = render_tokens(rows, "qwen3_5", 2)
    ids = batch.input_ids.clone()
    ids[batch.mm_token_type_ids == 1] = config["image_token_id"]
    ids[batch.mm_token_type_ids == 2] = config["video_token_id"]
    expected_ids, expected_deltas = hf_get_rope_index("qwen3_5", input_ids=ids, **batch.kwargs())
    token_form = {"input_ids": ids.tolist(), "video_grid_thw": [[2, 4, 4]], "image_grid_thw": [[1, 4, 6]]}
    for form in ({"rows": rows}, token_form):
        for model in ({"config": config}, {"preset": "qwen3.5-0.8b"}, {"family": "qwen3_5"}, {"family": "qwen3_5_moe"}):
            body = post(client, "/v1/mrope/positions", {**model, **form})
            assert torch.equal(torch.tensor(body["position_ids"]), expected_ids)
            assert torch.equal(torch.tensor(body["mrope_position_deltas"]), expected_deltas)


@pytest.mark.parametrize("compat", ["vllm", "sglang"])
def test_engine_compat_over_http(client: TestClient, compat: str) -> None:
    rows = [[{"text": 1}, {"video": [30, 2, 2], "second_per_grid_t": 0.7}]]
    model = {"family": "qwen2_5_vl", "tokens_per_second": 25, "rows": rows}
    engine = post(client, "/v1/mrope/positions", {**model, "compat": compat})
    default = post(client, "/v1/mrope/positions", model)
    assert engine["compat"] == compat
    t_engine, t_default = engine["position_ids"][0][0][1:], default["position_ids"][0][0][1:]
    assert [k for k, (a, b) in enumerate(zip(t_engine, t_default, strict=True)) if a != b] == [6, 12, 24, 26]


def test_qwen2_5_omni_over_http_equals_its_get_rope_index(client: TestClient) -> None:
    from omni_oracle import as_segments, hf_omni_get_rope_index, render_omni

    rows = [
        [{"text": 3}, {"video": [4, 4, 4], "second_per_grid_t": 1.0, "audio_seqlen": 400}, {"text": 2}],
        [{"text": 2}, {"audio_seqlen": 90}, {"text": 2}, {"image": [1, 4, 2]}, {"text": 3}],
    ]
    batch = render_omni(rows, 2, use_audio_in_video=True, pads=[0, 0], left=True)
    expected_ids, expected_deltas = hf_omni_get_rope_index(batch, merge=2, pps=25, seconds_per_chunk=2)
    token_form = batch.token_form("qwen2_5_omni")
    body = post(client, "/v1/mrope/positions", token_form)
    assert torch.equal(torch.tensor(body["position_ids"]), expected_ids)
    assert torch.equal(torch.tensor(body["mrope_position_deltas"]), expected_deltas)
    segments = {"family": "qwen2_5_omni", "rows": as_segments(rows, 2), "padding_side": "left"}
    body = post(client, "/v1/mrope/positions", segments)
    assert torch.equal(torch.tensor(body["position_ids"]), expected_ids)
    for hostile in (10**400, 2**63, -5):
        response = client.post("/v1/mrope/positions", json={**token_form, "audio_seqlens": [hostile, 90]})
        assert response.status_code == 422, response.text
    for hostile in (1e308, 10**400, -1):
        response = client.post("/v1/mrope/positions", json={**segments, "position_id_per_seconds": hostile})
        assert response.status_code == 422, response.text
    mm_types = {"family": "qwen2_5_omni", "mm_token_type_ids": [[0, 0]]}
    assert client.post("/v1/mrope/positions", json=mm_types).status_code == 422


def test_glm_image_over_http_gives_prefill_and_decode_positions(client: TestClient) -> None:
    import types

    from transformers.models.glm_image.modeling_glm_image import GlmImageModel

    ids = torch.tensor([[7, 7, 16384, *[167855] * 6, 16385, 7, 16384], [7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 16384, 7]])
    grids = torch.tensor([[1, 2, 3], [1, 4, 4], [1, 3, 5]])
    per_sample = torch.tensor([2, 1])
    stand_in = types.SimpleNamespace(config=types.SimpleNamespace(image_start_token_id=16384, image_end_token_id=16385))
    stand_in.get_vision_position_ids = types.MethodType(GlmImageModel.get_vision_position_ids, stand_in)
    expected, deltas = GlmImageModel.get_rope_index(stand_in, ids, image_grid_thw=grids, images_per_sample=per_sample)
    body = post(
        client,
        "/v1/mrope/positions",
        {
            "family": "glm_image",
            "input_ids": ids.tolist(),
            "image_grid_thw": grids.tolist(),
            "images_per_sample": per_sample.tolist(),
        },
    )
    assert torch.equal(torch.tensor(body["position_ids"]), expected)
    assert torch.equal(torch.tensor(body["mrope_position_deltas"]), deltas)
    assert torch.equal(torch.tensor(body["decode_position_ids"]), stand_in._cached_decode_position_ids)
    bad = {"family": "glm_image", "input_ids": ids.tolist(), "image_grid_thw": grids.tolist()}
    for counts in ([2**63, 1], [10**400, 0], [-1, 4]):
        assert client.post("/v1/mrope/positions", json={**bad, "images_per_sample": counts}).status_code == 422
    rows = [
        [{"text": 2}, {"image": [1, 2, 3]}, {"text": 2}, {"generate": [1, 4, 4]}],
        [{"text": 12}, {"generate": [1, 3, 5]}],
    ]
    segments = post(client, "/v1/mrope/positions", {"family": "glm_image", "rows": rows})
    assert torch.equal(torch.tensor(segments["position_ids"]), expected)
    assert torch.equal(torch.tensor(segments["decode_position_ids"]), stand_in._cached_decode_position_ids)
    bad_rows = [[{"generate": [1, 2, 2]}, {"image": [1, 2, 2]}]]
    assert client.post("/v1/mrope/positions", json={"family": "glm_image", "rows": bad_rows}).status_code == 422
    wrapping = {"family": "glm_image", "input_ids": [[7, 16384, 16385]], "image_grid_thw": [[1024, 2**27, 2**27]]}
    response = client.post("/v1/mrope/positions", json=wrapping)  # t*h*w = 2**64: 0 in int64 (was a 500)
    assert response.status_code == 422 and response.json()["field"] == "rows[0]", response.text
    huge = {"family": "glm_image", "input_ids": [[7]] * 4, "image_grid_thw": [[1, 3000, 3000]]}
    response = client.post("/v1/mrope/positions", json=huge, headers=SAFETENSORS)  # 864 MB of decode positions
    assert response.status_code == 422 and response.json()["field"] == "image_grid_thw", response.text


def test_hunyuan_vl_over_http_gives_four_axes(client: TestClient) -> None:
    types_ = [[0, 0, 1, 1, 1, 1, 1, 1, 0], [0, 1, 1, 1, 1, 1, 1, 1, 1]]  # 2x(2+1) grid; 6 + 2 marker tokens
    body = post(
        client,
        "/v1/mrope/positions",
        {"family": "hunyuan_vl", "mm_token_type_ids": types_, "image_grid_thw": [[1, 4, 4], [1, 4, 4]]},
    )
    ids = torch.tensor(body["position_ids"])
    assert ids.shape == (4, 2, 9)
    assert ids[:, 0, 2:8].tolist() == [[2, 3, 4, 5, 6, 7], [0, 1, 2, 0, 1, 2], [0, 0, 0, 1, 1, 1], [0] * 6]
    assert ids[3, 1, 2:8].tolist() == [1] * 6 and ids[:, 1, 1].tolist() == [1, 1, 1, 1]  # its markers stay 1-D
    rows = [
        [{"text": 2}, {"image": [1, 4, 4]}, {"text": 1}],
        [{"text": 1}, {"image": [1, 4, 4], "markers": True}],
    ]
    segments = post(client, "/v1/mrope/positions", {"family": "hunyuan_vl", "rows": rows})
    assert torch.equal(torch.tensor(segments["position_ids"]), ids)
    for axes in (2, 17, 2**63):
        too_many = {"family": "hunyuan_vl", "mm_token_type_ids": types_, "num_axes": axes}
        assert client.post("/v1/mrope/positions", json=too_many).status_code == 422


def test_qwen3_omni_over_http_gives_float_positions(client: TestClient) -> None:
    from omni_oracle import audio_tokens_qwen3, hf_qwen3_omni_get_rope_index, render_omni

    rows = [[{"text": 2}, {"video": [3, 4, 4], "second_per_grid_t": 0.7, "audio_seqlen": 130}, {"text": 3}]]
    batch = render_omni(rows, 2, use_audio_in_video=True, pads=[0], left=True, tokens_of=audio_tokens_qwen3)
    expected_ids, expected_deltas = hf_qwen3_omni_get_rope_index(batch, merge=2, pps=25)
    body = post(client, "/v1/mrope/positions", batch.token_form("qwen3_omni_moe"))
    assert torch.equal(torch.tensor(body["position_ids"], dtype=torch.float32), expected_ids)
    assert torch.equal(torch.tensor(body["mrope_position_deltas"], dtype=torch.float32), expected_deltas)
    assert any(value % 1 for value in body["position_ids"][0][0])  # fractional times survive


def test_minicpmv_over_http_equals_its_get_rope_index(client: TestClient) -> None:
    import types

    from transformers.models.minicpmv4_7.modeling_minicpmv4_7 import MiniCPMV4_7Model

    markers = {"slice_start": 901, "slice_end": 902, "image_start": 903, "image_end": 904, "newline": 905}
    thumb, crop = [8] * 4, [8] * 2
    ids = [7, 903, *thumb, 904, 901, *crop, 902, 901, *crop, 902, 905, 901, *crop, 902, 901, *crop, 902, 7, 7]
    kinds = [1 if token == 8 else 0 for token in ids]
    sizes = [[8, 8], [4, 8], [4, 8], [4, 8], [4, 8]]
    config = types.SimpleNamespace(downsample_mode="16x", **{f"{name}_id": value for name, value in markers.items()})
    stand_in = types.SimpleNamespace(config=config, _frame_end_idx=MiniCPMV4_7Model._frame_end_idx)
    for name in ("_group_visual_frames", "get_vision_position_ids"):
        setattr(stand_in, name, types.MethodType(getattr(MiniCPMV4_7Model, name), stand_in))
    expected, deltas = MiniCPMV4_7Model.get_rope_index(
        stand_in, torch.tensor([ids]), mm_token_type_ids=torch.tensor([kinds]), target_sizes=torch.tensor(sizes)
    )
    request = {
        "family": "minicpmv4_7",
        "input_ids": [ids],
        "mm_token_type_ids": [kinds],
        "target_sizes": sizes,
        "marker_ids": markers,
    }
    body = post(client, "/v1/mrope/positions", request)
    assert torch.equal(torch.tensor(body["position_ids"]), expected)
    assert torch.equal(torch.tensor(body["mrope_position_deltas"]), deltas)
    too_big = {"target_sizes": [[2**63, 8]] + sizes[1:]}
    hostile_markers = [{"marker_ids": {**markers, "newline": value}} for value in (2**63, 10**400, -1)]
    for bad in (too_big, {"marker_ids": {"newline": 905}}, {"downsample_mode": "8x"}, *hostile_markers):
        assert client.post("/v1/mrope/positions", json={**request, **bad}).status_code == 422


def test_a_preset_vision_config_is_checked_once_and_an_unknown_preset_is_refused_every_time(client: TestClient) -> None:
    rows = [[{"text": 2}, {"image": [1, 4, 4]}]]
    first = post(client, "/v1/mrope/positions", {"preset": "qwen2.5-vl-7b", "rows": rows})
    assert post(client, "/v1/mrope/positions", {"preset": "qwen2.5-vl-7b", "rows": rows}) == first
    assert preset_vision_config("qwen2.5-vl-7b") is preset_vision_config("qwen2.5-vl-7b")
    assert preset_vision_config("qwen2.5-vl-7b").spatial_merge_size == 2
    for _ in range(2):
        refusal = post(client, "/v1/mrope/positions", {"preset": "no-such-preset", "rows": rows}, status=422)
        assert refusal["field"] == "preset" and "no-such-preset" in refusal["detail"]
