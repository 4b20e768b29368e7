"""Request building (bodies, headers, Accept negotiation) and answer decoding (safetensors, JSON, numpy fallback)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from client_mocks import Recorder
from safetensors.torch import load as load_torch
from safetensors.torch import save as save_torch

import ropeserve_client as rc
from ropeserve_client._arrays import decode_safetensors, encode_safetensors

COS_SIN_META = {"rope_type": "default", "attention_factor": 1.0}


def safetensors_answer(tensors: dict[str, torch.Tensor], meta: dict[str, object]) -> httpx.Response:
    body = save_torch(tensors, metadata={"ropeserve": json.dumps(meta)})
    return httpx.Response(200, content=body, headers={"content-type": "application/x-safetensors"})


def client_for(recorder: Recorder, **options: object) -> rc.Client:
    return rc.Client("http://rs.test", transport=httpx.MockTransport(recorder), **options)  # type: ignore[arg-type]


def test_tensor_endpoints_ask_for_safetensors_and_send_clean_json(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "llama", "rope_theta": 500000.0}))
    recorder = Recorder(safetensors_answer({"cos": torch.ones(2, 4)}, COS_SIN_META))
    with client_for(recorder, token="s3cret") as client:
        client.cos_sin(range(0, 8, 2), config=config, dtype="bfloat16", future_option=True)
        client.cos_sin("3:5", preset="qwen3-8b")
        client.cos_sin(np.array([1, 2]), rope={"rope_theta": 1e4, "head_dim": 8})
    first, second, third = recorder.requests
    assert first.headers["accept"].startswith("application/x-safetensors")
    assert first.headers["authorization"] == "Bearer s3cret"
    assert first.headers["user-agent"].startswith("ropeserve-client/")
    assert json.loads(first.content) == {
        "config": {"model_type": "llama", "rope_theta": 500000.0},
        "positions": {"start": 0, "stop": 8, "step": 2},
        "dtype": "bfloat16",
        "future_option": True,
    }
    assert json.loads(second.content) == {"preset": "qwen3-8b", "positions": {"start": 3, "stop": 5, "step": 1}}
    assert json.loads(third.content)["positions"] == [1, 2]


def test_json_endpoints_and_the_json_wire_ask_for_json() -> None:
    recorder = Recorder(httpx.Response(200, json={"cos": [[1.0, 0.5]], "count": 1, "params": {"x": [1, 2]}}))
    with client_for(recorder, wire="json") as client:
        client.info()
        result = client.cos_sin([0], preset="llama-3.1-8b")
    assert all(request.headers["accept"].startswith("application/json") for request in recorder.requests)
    assert list(result) == ["cos"] and result["cos"].dtype == torch.float32
    assert result.meta == {"count": 1, "params": {"x": [1, 2]}}


def test_rotation_bodies_are_safetensors_with_json_params() -> None:
    q, k = torch.randn(1, 4, 3, 8, dtype=torch.bfloat16), torch.randn(1, 2, 3, 8, dtype=torch.bfloat16)
    recorder = Recorder(safetensors_answer({"q": q, "k": k}, {"layout": "bhtd"}))
    with client_for(recorder) as client:
        result = client.apply_rope(q, k, positions=[0, 1, 2], preset="llama-3.1-8b", layout="bhtd")
    request = recorder.requests[0]
    assert request.headers["content-type"] == "application/x-safetensors"
    sent = load_torch(request.content)
    assert torch.equal(sent["q"], q) and torch.equal(sent["k"], k)
    assert sent["positions"].dtype == torch.int64 and sent["positions"].tolist() == [0, 1, 2]
    _, meta = decode_safetensors(request.content, "numpy")
    assert meta == {"preset": "llama-3.1-8b", "layout": "bhtd"}
    assert torch.equal(result["q"], q) and result.meta == {"layout": "bhtd"}


def test_numpy_backend_widens_bfloat16_exactly() -> None:
    values = torch.tensor([[1.0, -0.3333, 1e-20], [65504.0, 3.0e38, -0.0]], dtype=torch.bfloat16)
    body = save_torch({"cos": values, "ids": torch.arange(3)}, metadata={"ropeserve": json.dumps(COS_SIN_META)})
    tensors, meta = decode_safetensors(body, "numpy")
    assert tensors["cos"].dtype == np.float32 and tensors["ids"].dtype == np.int64
    assert np.array_equal(tensors["cos"], values.float().numpy())
    assert meta == COS_SIN_META
    torch_tensors, _ = decode_safetensors(body, "torch")
    assert torch_tensors["cos"].dtype == torch.bfloat16


def test_encoding_round_trips_numpy_and_torch_inputs() -> None:
    body = encode_safetensors({"a": np.arange(4, dtype=np.int32), "b": [[1.5, 2.5]]}, {"n": np.int64(3)})
    tensors, meta = decode_safetensors(body, "numpy")
    assert tensors["a"].tolist() == [0, 1, 2, 3] and tensors["b"].dtype == np.float64 and meta == {"n": 3}
    mixed = encode_safetensors({"q": torch.ones(2, dtype=torch.float16), "p": np.arange(2)}, {})
    decoded, _ = decode_safetensors(mixed, "torch")
    assert decoded["q"].dtype == torch.float16 and decoded["p"].dtype == torch.int64


def test_undecodable_answers_raise_decode_error() -> None:
    garbage = httpx.Response(200, content=b"\xff" * 4, headers={"content-type": "application/x-safetensors"})
    lying = httpx.Response(200, content=b"<html>", headers={"content-type": "text/html"})
    with client_for(Recorder(garbage, lying)) as client:
        with pytest.raises(rc.DecodeError):
            client.cos_sin([0], preset="x")
        with pytest.raises(rc.DecodeError):
            client.info()


def test_timeouts_reach_every_request_and_a_silent_server_times_out() -> None:
    recorder = Recorder(httpx.Response(200, json={}))
    with client_for(recorder) as client:
        client.info()
    assert recorder.requests[0].extensions["timeout"] == {"connect": 5.0, "read": 60.0, "write": 60.0, "pool": 60.0}
    import socket

    with socket.socket() as silent:  # accepts connections (kernel backlog) but never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        with rc.Client(url, timeout=httpx.Timeout(0.2, connect=1.0)) as client, pytest.raises(rc.RequestTimeout):
            client.info()


def test_one_connection_is_reused_across_calls() -> None:
    with rc.Client("http://rs.test", transport=httpx.MockTransport(Recorder(httpx.Response(200, json={})))) as client:
        http = client._http
        client.info()
        client.info()
        assert client._http is http and not http.is_closed
    assert http.is_closed


def test_an_injected_http_client_is_left_open() -> None:
    http = httpx.Client(
        base_url="http://rs.test", transport=httpx.MockTransport(Recorder(httpx.Response(200, json={})))
    )
    with rc.Client(http_client=http) as client:
        client.info()
    assert not http.is_closed
    http.close()


NUMPY_FALLBACK = textwrap.dedent(
    """
    import json, sys
    sys.modules["torch"] = None  # as if torch were not installed
    import httpx, numpy as np, ropeserve_client as rc
    from ropeserve_client._arrays import encode_safetensors

    body = encode_safetensors({"cos": np.ones((2, 4), np.float32)}, {"dtype": "float32"})
    answer = httpx.Response(200, content=body, headers={"content-type": "application/x-safetensors"})
    with rc.Client("http://rs.test", transport=httpx.MockTransport(lambda request: answer)) as client:
        result = client.cos_sin(np.arange(2), preset="llama-3.1-8b")
    try:
        rc.Client(array_backend="torch")
        forced = "no error"
    except ImportError as error:
        forced = str(error)
    print(json.dumps({"backend": client.backend, "type": type(result["cos"]).__name__, "forced": forced}))
    """
)


def test_without_torch_results_are_numpy_arrays() -> None:
    completed = subprocess.run(
        [sys.executable, "-c", NUMPY_FALLBACK], capture_output=True, text=True, timeout=60, check=True
    )
    report = json.loads(completed.stdout)
    assert report["backend"] == "numpy" and report["type"] == "ndarray"
    assert "pip install 'ropeserve-client[torch]'" in report["forced"]
