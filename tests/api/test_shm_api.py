"""Shared-memory transport: region lifecycle, rotations through regions, every refusal, per-credential isolation.

Rotations through regions must equal the safetensors body path bit for bit. Refusals are 4xx problem documents;
a region its client truncated or unlinked is a 409 and the process (this test process: TestClient runs the app
in it) survives, which it would not if the server touched the missing pages (SIGBUS).
"""

from __future__ import annotations

import asyncio
import json
import mmap
import os
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import torch
from fastapi.testclient import TestClient
from safetensors.torch import load, save

from ropeserve.api import create_app
from ropeserve.settings import Settings
from ropeserve_client.testing import LocalServer

SHM = Path("/dev/shm")
ROPE = {"rope_theta": 10_000.0, "head_dim": 16}
TOKENS, HEADS = 8, 2
TOKEN_A, TOKEN_B = "token-of-client-a", "token-of-client-b"
REGIONS = "/v1/shm/regions"


class ShmObject:
    """A POSIX shared-memory object made by the test (the client's side), mapped read-write."""

    def __init__(self, size: int) -> None:
        self.key = f"ropeserve_test_{uuid.uuid4().hex[:12]}"
        self.path = SHM / self.key
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        os.ftruncate(self.fd, size)
        self.size = size
        self.mapping = mmap.mmap(self.fd, size)

    def tensor(self, offset: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        count = int(torch.Size(shape).numel())
        return torch.frombuffer(self.mapping, dtype=dtype, count=count, offset=offset).view(shape)

    def remove(self) -> None:
        os.close(self.fd)
        self.path.unlink(missing_ok=True)


@pytest.fixture()
def shm_object() -> Iterator[Callable[[int], ShmObject]]:
    made: list[ShmObject] = []

    def make(size: int) -> ShmObject:
        made.append(ShmObject(size))
        return made[-1]

    yield make
    for item in made:
        item.remove()


@pytest.fixture()
def client() -> Iterator[TestClient]:
    with TestClient(create_app(Settings(access_log=False, shm_max_regions_per_client=3))) as test_client:
        yield test_client


def ref(region: str, offset: int, shape: tuple[int, ...], dtype: str) -> dict[str, object]:
    return {"region": region, "offset": offset, "shape": list(shape), "dtype": dtype}


def register(client: TestClient, name: str, obj: ShmObject, **extra: object) -> httpx.Response:
    return client.post(REGIONS, json={"name": name, "key": "/" + obj.key, "byte_size": obj.size, **extra})


def staged(obj: ShmObject, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, dict[str, object]]:
    """q (bfloat16 [1, H, T, 16]) and positions written at offsets 0 and after q; their refs."""
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(1, HEADS, TOKENS, 16, generator=generator).to(torch.bfloat16)
    positions = torch.randint(0, 4000, (TOKENS,), generator=generator)
    obj.tensor(0, tuple(q.shape), torch.bfloat16).copy_(q)
    obj.tensor(q.numel() * 2, (TOKENS,), torch.int64).copy_(positions)
    refs = {"q": ref("r", 0, tuple(q.shape), "bfloat16"), "positions": ref("r", q.numel() * 2, (TOKENS,), "int64")}
    return q, positions, refs


def by_body(client: TestClient, q: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """The same rotation over the safetensors body path."""
    body = save({"q": q, "positions": positions}, metadata={"ropeserve": json.dumps({"rope": ROPE})})
    answer = client.post("/v1/rope/apply", content=body, headers={"content-type": "application/x-safetensors"})
    assert answer.status_code == 200, answer.text
    return load(answer.content)["q"]


def rotate(client: TestClient, refs: dict[str, object], **headers: str) -> httpx.Response:
    return client.post("/v1/rope/apply", json={"params": {"rope": ROPE}, **refs}, headers=headers)


def assert_problem(response: httpx.Response, status: int, field: str | None = None) -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    if field is not None:
        assert response.json()["field"] == field


# --- lifecycle and results -------------------------------------------------------------------------------------------


def test_region_lifecycle(client: TestClient, shm_object: Callable[[int], ShmObject]) -> None:
    obj = shm_object(4096)
    created = register(client, "r", obj)
    assert created.status_code == 201
    assert created.json() == {"name": "r", "key": "/" + obj.key, "byte_size": 4096, "read_only": False}
    assert register(client, "r", obj).status_code == 201  # the same registration again: idempotent
    assert_problem(client.post(REGIONS, json={"name": "r", "key": "/" + obj.key, "byte_size": 1024}), 409, "name")
    assert client.get(REGIONS).json() == {"regions": [created.json()]}
    assert client.delete(f"{REGIONS}/r").status_code == 204
    assert client.get(REGIONS).json() == {"regions": []}
    assert_problem(client.delete(f"{REGIONS}/r"), 404)
    _, _, refs = staged(obj)
    assert_problem(rotate(client, refs), 404, "region")


def test_rotation_in_place_equals_the_body_path(client: TestClient, shm_object: Callable[[int], ShmObject]) -> None:
    obj = shm_object(4096)
    register(client, "r", obj)
    q, positions, refs = staged(obj)
    answer = rotate(client, refs)
    assert answer.status_code == 200, answer.text
    assert answer.json()["outputs"] == {"q": refs["q"]}
    assert answer.json()["metadata"]["dtype"] == "bfloat16"
    assert torch.equal(obj.tensor(0, tuple(q.shape), torch.bfloat16), by_body(client, q, positions))


def test_rotation_into_an_output_region_leaves_the_input(
    client: TestClient, shm_object: Callable[[int], ShmObject]
) -> None:
    source, target = shm_object(4096), shm_object(4096)
    register(client, "r", source, read_only=True)
    register(client, "out", target)
    q, positions, refs = staged(source)
    k = torch.randn(1, 1, TOKENS, 16).to(torch.bfloat16)
    k_offset = 2048
    source.tensor(k_offset, tuple(k.shape), torch.bfloat16).copy_(k)
    refs["k"] = ref("r", k_offset, tuple(k.shape), "bfloat16")
    refs["outputs"] = {
        "q": ref("out", 0, tuple(q.shape), "bfloat16"),
        "k": ref("out", 1024, tuple(k.shape), "bfloat16"),
    }
    answer = rotate(client, refs)
    assert answer.status_code == 200, answer.text
    assert torch.equal(source.tensor(0, tuple(q.shape), torch.bfloat16), q)  # input untouched
    body = save({"q": q, "k": k, "positions": positions}, metadata={"ropeserve": json.dumps({"rope": ROPE})})
    expected = load(
        client.post("/v1/rope/apply", content=body, headers={"content-type": "application/x-safetensors"}).content
    )
    assert torch.equal(target.tensor(0, tuple(q.shape), torch.bfloat16), expected["q"])
    assert torch.equal(target.tensor(1024, tuple(k.shape), torch.bfloat16), expected["k"])


def test_regions_are_forgotten_at_shutdown(shm_object: Callable[[int], ShmObject]) -> None:
    obj = shm_object(4096)
    app = create_app(Settings(access_log=False))
    with TestClient(app) as client:
        register(client, "r", obj)
        region = app.state.runtime.extensions["shm"].regions("anonymous")[0]
    assert app.state.runtime.extensions["shm"].regions("anonymous") == []
    assert region.closed
    with pytest.raises(OSError):
        os.fstat(region.fd)


# --- refusals --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "key", "field"),
    [
        ("../etc", None, "name"),
        ("a/b", None, "name"),
        ("", None, "name"),
        ("r", "/ropeserve_x/../../etc/passwd", "key"),
        ("r", "ropeserve_dir/sub", "key"),
        ("r", "/..", "key"),
        ("r", "/other_prefix_object", "key"),
    ],
)
def test_names_and_keys_are_validated(client: TestClient, name: str, key: str | None, field: str) -> None:
    answer = client.post(REGIONS, json={"name": name, "key": key or "/ropeserve_ok", "byte_size": 64})
    assert_problem(answer, 422, field)


def test_missing_object_symlink_and_short_object_are_refused(
    client: TestClient, shm_object: Callable[[int], ShmObject]
) -> None:
    assert_problem(client.post(REGIONS, json={"name": "r", "key": "/ropeserve_absent_x", "byte_size": 64}), 404, "key")
    obj = shm_object(1024)
    link = SHM / f"ropeserve_link_{uuid.uuid4().hex[:8]}"
    link.symlink_to(obj.path)
    try:
        assert_problem(client.post(REGIONS, json={"name": "r", "key": link.name, "byte_size": 64}), 422, "key")
    finally:
        link.unlink()
    answer = client.post(REGIONS, json={"name": "r", "key": obj.key, "byte_size": 4096})
    assert_problem(answer, 422, "byte_size")
    for size in (0, -1, 10**400, 2**63):
        assert_problem(client.post(REGIONS, json={"name": "r", "key": obj.key, "byte_size": size}), 422, "byte_size")


def test_regions_per_client_are_bounded(client: TestClient, shm_object: Callable[[int], ShmObject]) -> None:
    obj = shm_object(64)
    for index in range(3):
        assert register(client, f"r{index}", obj).status_code == 201
    assert_problem(register(client, "r3", obj), 422, "name")
    client.delete(f"{REGIONS}/r0")
    assert register(client, "r3", obj).status_code == 201


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"q": ref("r", 4000, (1, HEADS, TOKENS, 16), "bfloat16")}, "q"),  # past the end
        ({"q": ref("r", 1025, (1, HEADS, TOKENS, 16), "bfloat16")}, "q"),  # misaligned
        ({"q": ref("r", 0, (2**40, 2**40), "bfloat16")}, "q"),  # more elements than allowed
        ({"q": ref("r", 2**62, (1,), "bfloat16")}, "q.offset"),
        ({"q": ref("r", 0, (1, HEADS, TOKENS, 16), "int32")}, "q"),  # not a float dtype
        ({"positions": ref("r", 100, (TOKENS,), "int64")}, "positions"),  # overlaps q
        ({"outputs": {"q": ref("r", 0, (1, HEADS, TOKENS, 8), "bfloat16")}}, "q"),  # other shape
        ({"outputs": {"q": ref("r", 1024, (1, HEADS, TOKENS, 16), "float32")}}, "q"),  # other dtype
        ({"q": ref("elsewhere", 0, (1,), "bfloat16")}, "region"),  # not registered
    ],
)
def test_tensor_references_are_checked(
    client: TestClient, shm_object: Callable[[int], ShmObject], change: dict[str, object], field: str
) -> None:
    obj = shm_object(4096)
    register(client, "r", obj)
    q, _, refs = staged(obj)
    before = obj.tensor(0, tuple(q.shape), torch.bfloat16).clone()
    answer = rotate(client, {**refs, **change})
    assert_problem(answer, 404 if field == "region" else 422, field)
    assert torch.equal(obj.tensor(0, tuple(q.shape), torch.bfloat16), before)  # nothing written


def test_read_only_region_cannot_be_answered_in_place(
    client: TestClient, shm_object: Callable[[int], ShmObject]
) -> None:
    obj = shm_object(4096)
    register(client, "r", obj, read_only=True)
    _, _, refs = staged(obj)
    assert_problem(rotate(client, refs), 422, "outputs.q")


@pytest.mark.parametrize("damage", ["truncate", "unlink"])
def test_truncated_or_unlinked_region_is_a_409_and_the_server_lives(
    client: TestClient, shm_object: Callable[[int], ShmObject], damage: str
) -> None:
    obj = shm_object(4096)
    register(client, "r", obj)
    q, positions, refs = staged(obj)
    if damage == "truncate":
        os.ftruncate(obj.fd, 0)
    else:
        obj.path.unlink()
    assert_problem(rotate(client, refs), 409, "r")
    assert client.get("/health/live").status_code == 200
    if damage == "truncate":  # grown back: usable again
        os.ftruncate(obj.fd, 4096)
        obj.tensor(0, tuple(q.shape), torch.bfloat16).copy_(q)
        obj.tensor(q.numel() * 2, (TOKENS,), torch.int64).copy_(positions)
        assert rotate(client, refs).status_code == 200


# --- credentials and isolation ---------------------------------------------------------------------------------------


def test_two_credentials_cannot_see_each_others_regions(shm_object: Callable[[int], ShmObject]) -> None:
    settings = Settings(access_log=False, auth_token=TOKEN_A, auth_tokens=[TOKEN_B])
    a_obj, b_obj = shm_object(4096), shm_object(4096)
    with TestClient(create_app(settings)) as client:
        as_a, as_b = {"authorization": f"Bearer {TOKEN_A}"}, {"authorization": f"Bearer {TOKEN_B}"}
        assert client.post(REGIONS, json={"name": "r", "key": a_obj.key, "byte_size": 4096}).status_code == 401
        assert (
            client.post(REGIONS, json={"name": "r", "key": a_obj.key, "byte_size": 4096}, headers=as_a).status_code
            == 201
        )
        assert client.get(REGIONS, headers=as_b).json() == {"regions": []}
        q, positions, refs = staged(a_obj)
        assert_problem(rotate(client, refs, **as_b), 404, "region")
        assert_problem(client.delete(f"{REGIONS}/r", headers=as_b), 404)
        assert (
            client.post(REGIONS, json={"name": "r", "key": b_obj.key, "byte_size": 4096}, headers=as_b).status_code
            == 201
        )
        staged(b_obj, seed=1)
        assert rotate(client, refs, **as_a).status_code == 200
        assert [region["key"] for region in client.get(REGIONS, headers=as_a).json()["regions"]] == [a_obj.key]
        expected = by_body_authorized(client, q, positions, as_a)
        assert torch.equal(a_obj.tensor(0, tuple(q.shape), torch.bfloat16), expected)


def by_body_authorized(
    client: TestClient, q: torch.Tensor, positions: torch.Tensor, auth: dict[str, str]
) -> torch.Tensor:
    body = save({"q": q, "positions": positions}, metadata={"ropeserve": json.dumps({"rope": ROPE})})
    headers = {"content-type": "application/x-safetensors", **auth}
    return load(client.post("/v1/rope/apply", content=body, headers=headers).content)["q"]


def test_concurrent_rotations_on_different_regions_get_their_own_answers(
    shm_object: Callable[[int], ShmObject],
) -> None:
    """Over a real socket: 8 clients at once, each on its own region with its own data, answers batched
    together by the server; each region ends up holding exactly its own rotation."""
    objects = [shm_object(4096) for _ in range(8)]
    staged_data = [staged(obj, seed=index) for index, obj in enumerate(objects)]
    with LocalServer(env={"ROPESERVE_BATCH_MAX_WAIT_US": "20000", "OMP_NUM_THREADS": "1"}) as server:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            for index, obj in enumerate(objects):
                answer = http.post(REGIONS, json={"name": f"r{index}", "key": obj.key, "byte_size": obj.size})
                assert answer.status_code == 201

        def one(index: int) -> dict[str, object]:
            _, _, refs = staged_data[index]
            renamed = {name: {**value, "region": f"r{index}"} for name, value in refs.items()}  # type: ignore[dict-item]
            with httpx.Client(base_url=server.url, timeout=30) as http:
                answer = http.post("/v1/rope/apply", json={"params": {"rope": ROPE}, **renamed})
            assert answer.status_code == 200, answer.text
            return answer.json()["metadata"]["batch"]

        with ThreadPoolExecutor(8) as pool:
            batches = list(pool.map(one, range(8)))
        with httpx.Client(base_url=server.url, timeout=30) as http:
            for index, obj in enumerate(objects):
                q, positions, _ = staged_data[index]
                body = save({"q": q, "positions": positions}, metadata={"ropeserve": json.dumps({"rope": ROPE})})
                answer = http.post(
                    "/v1/rope/apply", content=body, headers={"content-type": "application/x-safetensors"}
                )
                assert torch.equal(obj.tensor(0, tuple(q.shape), torch.bfloat16), load(answer.content)["q"]), index
    assert max(batch["size"] for batch in batches) > 1  # the requests really were rotated together


def test_large_copies_run_off_the_event_loop(
    client: TestClient, shm_object: Callable[[int], ShmObject], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Copying q into its output region and the answer back are host work sized by the tensors: beyond the inline
    bound they run in the threadpool (no running event loop there), and the answer is still the body path's."""
    from ropeserve.api import routes_shm

    tokens = 512  # 2 heads x 512 x 16 = 16384 elements, beyond the inline bound
    source, target = shm_object(1 << 16), shm_object(1 << 16)
    register(client, "r", source)
    register(client, "out", target)
    q = torch.randn(1, HEADS, tokens, 16).to(torch.bfloat16)
    positions = torch.arange(tokens)
    source.tensor(0, tuple(q.shape), torch.bfloat16).copy_(q)
    source.tensor(q.numel() * 2, (tokens,), torch.int64).copy_(positions)
    refs: dict[str, object] = {
        "q": ref("r", 0, tuple(q.shape), "bfloat16"),
        "positions": ref("r", q.numel() * 2, (tokens,), "int64"),
        "outputs": {"q": ref("out", 0, tuple(q.shape), "bfloat16")},
    }
    loops: list[bool] = []
    real_copy_all = routes_shm.copy_all

    def recording(copies: routes_shm.Copies) -> None:
        if not copies:
            return
        try:
            asyncio.get_running_loop()
            loops.append(True)
        except RuntimeError:
            loops.append(False)
        real_copy_all(copies)

    monkeypatch.setattr(routes_shm, "copy_all", recording)
    answer = rotate(client, refs)
    assert answer.status_code == 200, answer.text
    assert loops and not any(loops)
    assert torch.equal(target.tensor(0, tuple(q.shape), torch.bfloat16), by_body(client, q, positions))
