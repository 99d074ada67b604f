"""A ``sera-serve`` child process (tests, ``tools/bench_serve.py``, a local judge): started on a free port, ready
once ``/health`` answers, stopped gracefully (SIGTERM: requests in flight finish) or killed."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

import httpx

LISTENING = re.compile(r"sera-serve: listening on (http://\S+)")


class ServerProcess:
    """A running ``sera-serve``; ``url`` is its root (``url + "/v1"`` for an OpenAI client), ``log`` its output."""

    def __init__(self, args: Sequence[str], *, env: dict | None = None, startup_s: float = 300.0):
        self.args = list(args)
        self.log = Path(tempfile.mkstemp(prefix="sera-serve-", suffix=".log")[1])
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "sera_jax.cli.serve", *self.args],
                                         stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
        self.url = self._wait_ready(startup_s)

    def _wait_ready(self, startup_s: float) -> str:
        deadline, url = time.monotonic() + startup_s, None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sera-serve exited with {self.proc.returncode}:\n{self.output()[-4000:]}")
            if url is None:
                m = LISTENING.search(self.output())
                url = m.group(1) if m else None
            if url is not None:
                try:
                    if httpx.get(url + "/health", timeout=2.0).status_code == 200:
                        return url
                except httpx.HTTPError:
                    pass
            time.sleep(0.2)
        self.kill()
        raise TimeoutError(f"sera-serve was not ready within {startup_s:g} s:\n{self.output()[-4000:]}")

    def output(self) -> str:
        """Returns what the server printed so far."""
        return self.log.read_text(errors="replace")

    def stop(self, timeout_s: float = 60.0) -> int:
        """Stops the server gracefully (SIGTERM); returns its exit status (killed after ``timeout_s``)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.returncode

    def kill(self) -> None:
        """Kills the server at once (SIGKILL), as a crash would."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def serve_process(source: Sequence[str], *extra: str, host: str = "127.0.0.1", port: int = 0,
                  startup_s: float = 300.0, env: dict | None = None) -> ServerProcess:
    """Returns a ready ``sera-serve`` process for ``source`` (``[RUN_DIR]`` or ``["--hf", DIR]``) with ``extra``
    flags, on ``host``:``port`` (0: a free port)."""
    return ServerProcess([*source, "--host", host, "--port", str(port), "--log-level", "warning", *extra],
                         env=env, startup_s=startup_s)
