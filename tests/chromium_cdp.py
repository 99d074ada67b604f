"""A minimal Chrome DevTools Protocol driver for tests: headless chromium, one page, standard library only.

``Browser(binary, tmp_dir)`` starts chromium with ``--remote-debugging-port=0``, reads the port it chose from
``DevToolsActivePort`` in its profile directory, finds the page target over the HTTP endpoint (``/json/list``) and
speaks RFC 6455 WebSocket (masked client frames) to it. ``call(method, **params)`` returns a command's result;
``evaluate(expr)`` returns a JavaScript value; ``click(selector)`` dispatches a real mouse press/release at the
element's centre; ``type_text(text)`` inserts text as keyboard input into the focused element.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import struct
import subprocess
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlparse


class CDPError(RuntimeError):
    pass


class Browser:
    def __init__(self, binary: str, tmp_dir: Path, timeout: float = 30.0):
        self.timeout = timeout
        profile = Path(tmp_dir) / "cdp-profile"
        profile.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run",
             "--disable-extensions", "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
             f"--user-data-dir={profile}", "--window-size=1200,900", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            port = self._wait_port(profile / "DevToolsActivePort")
            ws_url = self._page_ws(port)
            self.sock = self._connect(ws_url)
        except BaseException:
            self.close()
            raise
        self._id = 0

    # ------------------------------------------------------------------------------------------- connection
    def _wait_port(self, path: Path) -> int:
        end = time.monotonic() + self.timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise CDPError(f"chromium exited with {self.proc.returncode}")
            if path.exists():
                lines = path.read_text().split()
                if lines and lines[0].isdigit():
                    return int(lines[0])
            time.sleep(0.05)
        raise CDPError("chromium did not open a debugging port")

    def _page_ws(self, port: int) -> str:
        end = time.monotonic() + self.timeout
        while time.monotonic() < end:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=5) as r:
                targets = json.loads(r.read())
            pages = [t for t in targets if t.get("type") == "page" and t.get("webSocketDebuggerUrl")]
            if pages:
                return pages[0]["webSocketDebuggerUrl"]
            time.sleep(0.05)
        raise CDPError("no page target")

    def _connect(self, ws_url: str) -> socket.socket:
        u = urlparse(ws_url)
        sock = socket.create_connection((u.hostname, u.port), timeout=self.timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        sock.sendall((f"GET {u.path} HTTP/1.1\r\nHost: {u.hostname}:{u.port}\r\nUpgrade: websocket\r\n"
                      f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n")
                     .encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = sock.recv(4096)
            if not chunk:
                raise CDPError("websocket handshake: connection closed")
            head += chunk
        if b" 101 " not in head.split(b"\r\n", 1)[0]:
            raise CDPError(f"websocket handshake refused: {head[:200]!r}")
        self._buf = head.split(b"\r\n\r\n", 1)[1]
        return sock

    def _recv_exact(self, n: int) -> bytes:
        while len(self._buf) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise CDPError("websocket closed")
            self._buf += chunk
        out, self._buf = self._buf[:n], self._buf[n:]
        return out

    def _send(self, text: str) -> None:
        data = text.encode()
        n = len(data)
        head = bytes([0x81])  # FIN + text
        if n < 126:
            head += bytes([0x80 | n])
        elif n < 1 << 16:
            head += bytes([0x80 | 126]) + struct.pack(">H", n)
        else:
            head += bytes([0x80 | 127]) + struct.pack(">Q", n)
        mask = os.urandom(4)
        self.sock.sendall(head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))

    def _recv_message(self) -> str:
        parts = []
        while True:
            b0, b1 = self._recv_exact(2)
            n = b1 & 0x7F
            if n == 126:
                n = struct.unpack(">H", self._recv_exact(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self._recv_exact(8))[0]
            mask = self._recv_exact(4) if b1 & 0x80 else None
            payload = self._recv_exact(n)
            if mask:
                payload = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
            opcode = b0 & 0x0F
            if opcode == 0x8:
                raise CDPError("websocket closed by the browser")
            if opcode in (0x9, 0xA):  # ping / pong: not used by chromium's DevTools server in practice
                continue
            parts.append(payload)
            if b0 & 0x80:
                return b"".join(parts).decode()

    # ---------------------------------------------------------------------------------------------- commands
    def call(self, method: str, **params):
        """Returns the result of one CDP command (events received meanwhile are dropped)."""
        self._id += 1
        mid = self._id
        self._send(json.dumps({"id": mid, "method": method, "params": params}))
        while True:
            msg = json.loads(self._recv_message())
            if msg.get("id") == mid:
                if "error" in msg:
                    raise CDPError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    def evaluate(self, expr: str):
        """Returns the value of a JavaScript expression in the page (by value)."""
        res = self.call("Runtime.evaluate", expression=expr, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in res:
            raise CDPError(f"{expr}: {res['exceptionDetails']}")
        return res["result"].get("value")

    def navigate(self, url: str) -> None:
        """Loads ``url`` and waits until the document is complete."""
        self.call("Page.navigate", url=url)
        self.wait_for("document.readyState === 'complete' && location.href !== 'about:blank'")

    def wait_for(self, expr: str, timeout: float | None = None) -> None:
        end = time.monotonic() + (timeout or self.timeout)
        while time.monotonic() < end:
            if self.evaluate(expr):
                return
            time.sleep(0.05)
        raise CDPError(f"timed out waiting for {expr}")

    def click(self, selector_expr: str) -> None:
        """Scrolls the element ``selector_expr`` (a JS expression yielding it) into view and clicks its centre."""
        box = self.evaluate(f"(function(){{var e={selector_expr}; e.scrollIntoView({{block:'center'}});"
                            "var r=e.getBoundingClientRect(); return [r.left + Math.min(r.width/2, 20), "
                            "r.top + r.height/2];})()")
        x, y = box
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1)

    def type_text(self, text: str) -> None:
        """Inserts ``text`` into the focused element as if typed (fires ``input`` events)."""
        self.call("Input.insertText", text=text)

    def close(self) -> None:
        try:
            if getattr(self, "sock", None) is not None:
                self.sock.close()
        finally:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
