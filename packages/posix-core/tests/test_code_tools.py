"""The code tools end to end on a real tmpdir workspace: text for the model, images as images.

A plot must reach the model as an image through every exporter (MCP image
content, Anthropic image blocks, OpenAI Responses image parts), never as
base64 pasted into the text.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from corral import (
    ToolImage,
    WorkspaceSession,
    anthropic_tool_results,
    open_workspace,
    openai_responses_tool_outputs,
)
from corral_posix import TmpdirWorkspaceProvider

pytestmark = pytest.mark.anyio

PNG = b"\x89PNG\r\n\x1a\n fake image bytes"
ENCODED = base64.b64encode(PNG).decode()
PLOT = f"class Plot:\n    def _repr_png_(self):\n        return {PNG!r}\ndisplay(Plot())\n'drawn'"


class _Provider(TmpdirWorkspaceProvider):
    provider_id: ClassVar[str] = "code-test-tmpdir"


@pytest.fixture
async def ws(tmp_path: Path) -> AsyncIterator[WorkspaceSession]:
    provider = _Provider(tmpdir_root=str(tmp_path))
    caps = {"code": {"is_stateful": True, "timeout_s": 5}}
    async with open_workspace(provider, caps) as session:
        yield session


async def test_images_are_lifted_out_of_the_text(ws: WorkspaceSession) -> None:
    result = await ws.call("workspace_run_code", {"language": "python", "code": PLOT})
    assert not result.is_error
    assert result.images == (ToolImage("image/png", ENCODED),)
    assert ENCODED not in result.content
    assert "image 1 attached: image/png" in result.content
    assert result.data["result"] == "drawn"
    assert result.data["state"] == "fresh"
    assert result.data["outputs"][0]["kind"] == "display"


async def test_exporters_attach_images(ws: WorkspaceSession) -> None:
    call = {"language": "python", "code": PLOT}
    message = await anthropic_tool_results(
        ws, [{"type": "tool_use", "id": "t1", "name": "workspace_run_code", "input": call}]
    )
    [block] = message["content"]
    text, image = block["content"]
    assert text["type"] == "text"
    assert ENCODED not in text["text"]
    assert image == {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": ENCODED},
    }
    outputs = await openai_responses_tool_outputs(
        ws,
        [
            {
                "type": "function_call",
                "call_id": "c1",
                "name": "workspace_run_code",
                "arguments": call,
            }
        ],
    )
    parts: Any = outputs[0]["output"]
    assert parts[0]["type"] == "input_text"
    assert parts[1] == {"type": "input_image", "image_url": f"data:image/png;base64,{ENCODED}"}


async def test_mcp_gets_image_content(ws: WorkspaceSession) -> None:
    from corral_mcp._server import to_call_result

    result = await ws.call("workspace_run_code", {"language": "python", "code": PLOT})
    mcp = to_call_result(result)
    kinds = [c.type for c in mcp.content]
    assert kinds == ["text", "image"]
    image: Any = mcp.content[1]
    assert image.data == ENCODED
    assert image.mime_type == "image/png"
    assert mcp.model_dump(by_alias=True)["content"][1]["mimeType"] == "image/png"


async def test_context_tools_keep_state_and_report_loss(ws: WorkspaceSession) -> None:
    created = await ws.call("workspace_create_code_context", {"language": "python"})
    ctx = created.data["context_id"]
    await ws.call("workspace_run_in_code_context", {"context_id": ctx, "code": "n = 7"})
    again = await ws.call("workspace_run_in_code_context", {"context_id": ctx, "code": "n * 6"})
    assert again.data["result"] == 42
    assert again.data["state"] == "kept"
    kill = "import os\nos.kill(os.getpid(), 9)"
    died = await ws.call("workspace_run_in_code_context", {"context_id": ctx, "code": kill})
    assert died.data["state"] == "lost"
    lost = await ws.call("workspace_run_in_code_context", {"context_id": ctx, "code": "n"})
    assert lost.is_error
    assert lost.error_code == "lost"
    deleted = await ws.call("workspace_delete_code_context", {"context_id": ctx})
    assert deleted.data == {"context_id": ctx, "deleted": True}


async def test_describe_names_the_real_languages(ws: WorkspaceSession) -> None:
    workspace = await ws.workspace()
    assert "python" in workspace.details()["code_languages"]
