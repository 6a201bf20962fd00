"""`make lab` starts a JupyterLab server that answers, also when run as root (as in Docker)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request

import pytest
from conftest import ROOT


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_lab_serves_the_book() -> None:
    port, token = _free_port(), "rope-tutor-test"
    args = f"--no-browser --ip=127.0.0.1 --port={port} --ServerApp.token={token}"
    server = subprocess.Popen(
        ["make", "--no-print-directory", "lab", f"LAB_ARGS={args}"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group, so the server and make stop together
    )
    url = f"http://127.0.0.1:{port}/api/contents?token={token}"
    try:
        deadline, listing = time.monotonic() + 90, None
        while time.monotonic() < deadline and server.poll() is None:
            try:
                with urllib.request.urlopen(url, timeout=5) as response:
                    listing = json.load(response)
                break
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.5)
        if listing is None:
            os.killpg(server.pid, signal.SIGTERM)
            output = server.communicate(timeout=30)[0].decode(errors="replace")
            pytest.fail(f"`make lab` did not answer on port {port}:\n{output[-3000:]}")
        names = {item["name"] for item in listing["content"]}
        assert "01_why_position.ipynb" in names, "the server is not opened at book/"
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
