"""The code image ci-setup.sh builds: interpreters that work under the hardened defaults."""

from __future__ import annotations

import pytest

import corral
import corral.provider
from corral_docker import DockerProvider
from corral_docker._options import CODE_IMAGE_ENV, DEFAULT_CODE_IMAGE, code_image

_PLOT = """
import io, sys
import matplotlib.pyplot as plt
import numpy as np
plt.plot(np.arange(10) ** 2)
buf = io.BytesIO()
plt.savefig(buf, format="png")
png = buf.getvalue()
print(png[:8] == b"\\x89PNG\\r\\n\\x1a\\n", len(png) > 1000, sys.stdin.read() == "")
"""


def test_code_image_names_the_built_image(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CODE_IMAGE_ENV, raising=False)
    assert code_image() == DEFAULT_CODE_IMAGE == "corral-python:bookworm"
    monkeypatch.setenv(CODE_IMAGE_ENV, "mine:1")
    assert code_image() == "mine:1"


@pytest.mark.anyio
@pytest.mark.docker
async def test_python_matplotlib_and_node_run_hardened(python_image: str, tmp_root: str) -> None:
    provider = DockerProvider(image=python_image, pull=False, tmpdir_root=tmp_root)
    opened = await provider.open(corral.ProviderConfig("docker"), corral.SessionRef("code"))
    try:
        shell = opened.workspace.shell
        assert shell is not None
        details = corral.provider.describe_workspace(opened.workspace)
        assert details["hardening"]["weakened"] == []
        # The program arrives on stdin (the attached stream), then reads EOF.
        plot = await shell.run(
            corral.provider.CommandRequest("python3 -c 'exec(input())'", stdin="")
        )
        assert plot.exit_code == 1  # EOF on input(): stdin really is empty
        script = await shell.run(
            corral.provider.CommandRequest(
                "python3 -I -c 'import sys; exec(sys.stdin.read())'", stdin=_PLOT, timeout_s=120
            )
        )
        assert script.exit_code == 0, script.stderr
        assert script.stdout.split() == ["True", "True", "True"]
        node = await shell.run(corral.provider.CommandRequest("node -e 'console.log(6*7)'"))
        assert (node.exit_code, node.stdout) == (0, "42\n")
    finally:
        await opened.workspace.close()
        await provider.aclose()
