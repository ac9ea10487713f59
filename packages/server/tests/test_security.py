"""Tokens, project scoping, input validation, size limits and bind rules over real HTTP."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from corral_server import ServiceError, WorkspaceService, check_mount_path
from corral_server._serve import check_bind
from server_support import SANDBOX, make_service, running

pytestmark = pytest.mark.anyio

MARKER = "ZZ-untrusted-<script>-marker"


@pytest.fixture
async def two_projects(tmp_path: Path, provider: Any) -> Any:
    service = make_service(tmp_path, provider)
    async with running(service) as (url, token_a):
        _pid, token_b = await service.create_project("p2")
        yield service, url, token_a, token_b
    await service.store.aclose()


def _h(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


async def test_token_of_one_project_never_sees_another(two_projects: Any) -> None:
    _service, url, a, b = two_projects
    async with httpx.AsyncClient(base_url=url) as http:
        ws = (await http.post("/v1/workspaces", json={"sandbox": SANDBOX}, headers=_h(a))).json()
        wid = ws["id"]
        h = (
            await http.post(f"/v1/workspaces/{wid}/exec", json={"command": "sleep"}, headers=_h(a))
        ).json()
        probes = [
            ("GET", f"/v1/workspaces/{wid}", None),
            ("PATCH", f"/v1/workspaces/{wid}", {"tags": ["x"]}),
            ("DELETE", f"/v1/workspaces/{wid}", None),
            ("POST", f"/v1/workspaces/{wid}/connect", None),
            ("POST", f"/v1/workspaces/{wid}/stop", None),
            ("GET", f"/v1/workspaces/{wid}/files/read?path=/x", None),
            ("GET", f"/v1/workspaces/{wid}/files/ls", None),
            ("POST", f"/v1/workspaces/{wid}/exec", {"command": "echo hi"}),
            ("GET", f"/v1/workspaces/{wid}/handles", None),
            ("GET", f"/v1/workspaces/{wid}/handles/{h['id']}", None),
            ("GET", f"/v1/workspaces/{wid}/handles/{h['id']}/read", None),
            ("GET", f"/v1/workspaces/{wid}/handles/{h['id']}/events", None),
            ("POST", f"/v1/workspaces/{wid}/handles/{h['id']}/kill", None),
        ]
        for method, path, body in probes:
            resp = await http.request(method, path, json=body, headers=_h(b))
            assert resp.status_code == 404, (method, path)
            assert resp.json()["error"]["code"] == "not_found"
        listed = (await http.get("/v1/workspaces", headers=_h(b))).json()
        assert listed == {"workspaces": [], "next_cursor": None}
        # ... and A still has it, untouched.
        assert (await http.get(f"/v1/workspaces/{wid}", headers=_h(a))).json()["tags"] == []


async def test_missing_or_bad_token_is_401(two_projects: Any) -> None:
    _service, url, a, _b = two_projects
    async with httpx.AsyncClient(base_url=url) as http:
        for headers in ({}, _h("nope"), _h(a + "x"), {"authorization": a}):
            resp = await http.get("/v1/workspaces", headers=headers)
            assert resp.status_code == 401
        assert (await http.get("/v1/health")).status_code == 200


async def test_bad_input_is_refused_without_echo(two_projects: Any) -> None:
    _service, url, a, _b = two_projects
    bad_bodies = [
        {"sandbox": MARKER},
        {"sandbox": {"provider": 5}},
        {"sandbox": {"provider": "in-memory", "mount_path": MARKER}},
        {"sandbox": {"provider": "in-memory", MARKER: 1}},
        {"sandbox": SANDBOX, "tags": [MARKER]},
        {"sandbox": SANDBOX, "tags": "x"},
        {"sandbox": SANDBOX, "metadata": [MARKER]},
        {"sandbox": SANDBOX, MARKER: True},
        {"sandbox": {"provider": MARKER}},
        {"sandbox": {"provider": "in-memory", "capabilities": [MARKER]}},
        {"sandbox": {"provider": "in-memory", "capabilities": ["docker-only"]}},
        {"sandbox": {"provider": "in-memory", "provider_options": {MARKER: "/etc"}}},
    ]
    async with httpx.AsyncClient(base_url=url, headers=_h(a)) as http:
        for body in bad_bodies:
            resp = await http.post("/v1/workspaces", json=body)
            assert resp.status_code in (400, 403), body
            assert MARKER not in resp.text
        resp = await http.post(
            "/v1/workspaces",
            content=b'{"sandbox": NaN}',
            headers={"content-type": "application/json"},
        )
        assert resp.status_code == 400
        resp = await http.post(
            "/v1/workspaces", content=b"[1]", headers={"content-type": "application/json"}
        )
        assert resp.status_code == 400
        resp = await http.post(
            "/v1/workspaces", content=b"{}", headers={"content-type": "text/plain"}
        )
        assert resp.status_code == 415
        wid = (await http.post("/v1/workspaces", json={"sandbox": SANDBOX})).json()["id"]
        for query in (
            f"path={MARKER}&source={MARKER}",
            f"path=/x&source=version&version_id={MARKER}",
            "path=/x&path=/y",
            "path=/../../etc/passwd",
            f"path=/{MARKER}",
        ):
            resp = await http.get(f"/v1/workspaces/{wid}/files/read?{query}")
            assert resp.status_code in (400, 404)
            assert MARKER not in resp.text
        for body in (
            {"command": 5},
            {"command": "x", "env": {"A": 1}},
            {"command": "x", "timeout_s": True},
            {"command": "x", MARKER: 1},
            {"command": "x", "cwd": ["/"]},
        ):
            resp = await http.post(f"/v1/workspaces/{wid}/exec", json=body)
            assert resp.status_code == 400
            assert MARKER not in resp.text
        resp = await http.get(f"/v1/workspaces/{MARKER}")
        assert resp.status_code == 400
        assert MARKER not in resp.text
        resp = await http.get("/v1/workspaces?limit=0")
        assert resp.status_code == 400
        resp = await http.get(f"/v1/workspaces?cursor={MARKER}")
        assert resp.status_code == 400
        assert MARKER not in resp.text


async def test_request_size_limit(two_projects: Any) -> None:
    _service, url, a, _b = two_projects
    big = {"sandbox": SANDBOX, "metadata": {"x": "y" * (2 << 20)}}
    async with httpx.AsyncClient(base_url=url, headers=_h(a)) as http:
        resp = await http.post("/v1/workspaces", json=big)
        assert resp.status_code == 413

        async def chunks() -> Any:  # no content-length: the cap holds while streaming
            yield b'{"metadata": "'
            for _ in range(40):
                yield b"y" * 65536

        resp = await http.post(
            "/v1/workspaces", content=chunks(), headers={"content-type": "application/json"}
        )
        assert resp.status_code == 413


@pytest.mark.parametrize(
    "path",
    [
        "relative",
        "/",
        "//",
        "/a/../b",
        "/..",
        "/tmp",
        "/tmp/x",
        "/proc",
        "/opt",
        "/run/x",
        "/dev/shm",
        "/sys",
        "/opt/corral/x",
        5,
        "",
        "/a\0b",
    ],
)
def test_mount_path_rules(path: object) -> None:
    with pytest.raises(ServiceError):
        check_mount_path(path)


def test_mount_path_accepts_workspace_paths() -> None:
    assert check_mount_path("/workspace") == "/workspace"
    assert check_mount_path("/home/agent/work/") == "/home/agent/work"
    assert check_mount_path("/optional") == "/optional"


def test_remote_bind_needs_allow_remote_and_tls(tmp_path: Path) -> None:
    check_bind("127.0.0.1", allow_remote=False, certfile=None, keyfile=None)
    check_bind("::1", allow_remote=False, certfile=None, keyfile=None)
    with pytest.raises(ServiceError, match="allow-remote"):
        check_bind("0.0.0.0", allow_remote=False, certfile=None, keyfile=None)
    with pytest.raises(ServiceError, match="tls"):
        check_bind("0.0.0.0", allow_remote=True, certfile=None, keyfile=None)
    with pytest.raises(ServiceError):
        check_bind("localhost", allow_remote=False, certfile=None, keyfile=None)
    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    cert.write_text("x")
    key.write_text("x")
    check_bind("0.0.0.0", allow_remote=True, certfile=str(cert), keyfile=str(key))


async def test_service_scoping_unit(tmp_path: Path, provider: Any) -> None:
    service: WorkspaceService = make_service(tmp_path, provider)
    await service.store.migrate()
    _a, _ = await service.create_project("a")
    with pytest.raises(ServiceError) as err:
        await service.create_project("a")
    assert err.value.code == "conflict"
    await service.store.aclose()


async def test_provider_factory_options_are_the_operators(two_projects: Any) -> None:
    _service, url, a, _b = two_projects
    body = {"sandbox": {**SANDBOX, "provider_options": {"max_workspace_bytes": 1}}}
    async with httpx.AsyncClient(base_url=url, headers=_h(a)) as http:
        resp = await http.post("/v1/workspaces", json=body)
    assert resp.status_code == 403
    assert resp.json()["error"]["code"] == "forbidden"
