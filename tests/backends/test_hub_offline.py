"""Issue 33 item 13: a hub model name without network fails in seconds, naming the model and
HF_HUB_OFFLINE, instead of hanging in transformers' retries (>200 s against a silent server)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LOAD = (
    "from batchtune.backends.models import load_model\n"
    "from batchtune.errors import BackendError\n"
    "from batchtune.recipe.schema import ModelConfig\n"
    "try:\n"
    "    load_model(ModelConfig(name='bogus-org/no-such-model-33'), 'cpu')\n"
    "except BackendError as exc:\n"
    "    print('ERR', exc)\n"
)


def _load(tmp_path: Path, **env: str) -> tuple[float, str]:
    full = dict(os.environ, PYTHONPATH=str(ROOT), HF_HOME=str(tmp_path / "hf"), **env)
    if "HF_HUB_OFFLINE" not in env:
        full.pop("HF_HUB_OFFLINE", None)
    t0 = time.monotonic()
    try:
        out = subprocess.run(
            [sys.executable, "-c", LOAD], env=full, capture_output=True, text=True, timeout=90
        )
    except subprocess.TimeoutExpired:
        pytest.fail("load_model hung for more than 90 s")
    return time.monotonic() - t0, out.stdout + out.stderr


@pytest.mark.slow  # 5 s of hub timeout plus a torch import in a subprocess
def test_silent_hub_fails_in_seconds(tmp_path: Path) -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)  # accepts connections and never answers: a hanging network
    try:
        took, out = _load(tmp_path, HF_ENDPOINT=f"http://127.0.0.1:{server.getsockname()[1]}")
    finally:
        server.close()
    assert "ERR model 'bogus-org/no-such-model-33'" in out, out
    assert "HF_HUB_OFFLINE" in out and ("did not answer" in out or "cannot be reached" in out)
    assert took < 60, took  # imports under load included; the old code hung past 200 s


def test_offline_setting_fails_at_once_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from batchtune.backends.models import load_model
    from batchtune.errors import BackendError
    from batchtune.recipe.schema import ModelConfig

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    t0 = time.monotonic()
    with pytest.raises(BackendError, match="not in the local hub cache and HF_HUB_OFFLINE is set") as err:
        load_model(ModelConfig(name="bogus-org/no-such-model-33"), "cpu")
    assert "'bogus-org/no-such-model-33'" in str(err.value)
    assert time.monotonic() - t0 < 30  # transformers imports under load included
