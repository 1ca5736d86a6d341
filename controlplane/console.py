"""A VMI's serial console, as `virtctl console` opens it: a websocket to virt-api's `console` subresource
(subresources.kubevirt.io, through kube-apiserver's aggregation layer), which virt-api carries to virt-handler and
virt-handler to the guest's serial port (pkg/virt-api/rest/console.go). The stream is plain bytes in binary frames,
subprotocol `plain.kubevirt.io` (kubevirt.io/client-go subresources/constants.go).

So `type(..., "poweroff")` is a user typing `poweroff` at the guest's shell: the guest powers itself off from inside.
"""
from __future__ import annotations

import ssl
import time
from typing import Any

PROTOCOL = "plain.kubevirt.io"


class ConsoleError(RuntimeError):
    """The console could not be opened or did not show what was expected: the message has what it showed."""


class Console:
    def __init__(self, plane: Any, namespace: str, name: str, timeout: float = 30.0):
        import websocket

        url = (plane.url.replace("https://", "wss://") +
               f"/apis/subresources.kubevirt.io/v1/namespaces/{namespace}/virtualmachineinstances/{name}/console")
        sslopt = {"cert_reqs": ssl.CERT_REQUIRED, "ca_certs": str(plane.pki.ca_cert),
                  "certfile": str(plane.pki.admin_cert), "keyfile": str(plane.pki.admin_key)}
        try:
            self._ws = websocket.create_connection(url, subprotocols=[PROTOCOL], sslopt=sslopt, timeout=timeout)
        except (websocket.WebSocketException, OSError) as exc:
            raise ConsoleError(f"the console of VMI {namespace}/{name} did not open: {exc}") from exc
        self.seen = b""

    def send(self, text: str) -> None:
        self._ws.send_binary(text.encode())

    def expect(self, wanted: str, timeout: float = 60.0) -> str:
        """Read until `wanted` has appeared (in what was read since the last expect); all that was read."""
        import websocket

        deadline = time.monotonic() + timeout
        start = len(self.seen)
        while wanted.encode() not in self.seen[start:]:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ConsoleError(f"the console did not show {wanted!r} in {timeout:.0f}s; it showed: "
                                   f"{self.seen[start:][-1500:].decode(errors='replace')!r}")
            self._ws.settimeout(min(left, 5.0))
            try:
                frame = self._ws.recv()
            except websocket.WebSocketTimeoutException:
                continue
            except (websocket.WebSocketException, OSError) as exc:
                raise ConsoleError(f"the console closed before showing {wanted!r}: {exc}; it showed: "
                                   f"{self.seen[start:][-1500:].decode(errors='replace')!r}") from exc
            self.seen += frame if isinstance(frame, bytes) else frame.encode()
        return self.seen[start:].decode(errors="replace")

    def close(self) -> None:
        self._ws.close()

    def __enter__(self) -> Console:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def run(plane: Any, namespace: str, name: str, command: str, expect: str | None = None,
        timeout: float = 120.0) -> str:
    """Type `command` at the guest's shell (after a prompt shows), and read until `expect` shows."""
    with Console(plane, namespace, name) as console:
        console.send("\r")
        console.expect("# ", timeout=timeout)
        console.send(command + "\r")
        return console.expect(expect or command, timeout=timeout)
