"""Runs a process as a "pod": in a network and mount namespace of its own, with the cluster's hosts file.

Knative's components bind every interface (`:8080` health probes in every knative.dev/pkg `sharedmain`, the
data plane's `:8080`) and publish `*.svc.cluster.local` URLs. In a namespace of its own each binds only its own
loopback, as in a pod, and two of them never clash on a port. The hosts file stands in for cluster DNS: it is
bind-mounted over /etc/hosts in the pod's mount namespace (Go's resolver and glibc read it; Go re-reads it
when it changes). `Proxy` stands in for kube-proxy: it listens, inside each pod, on the Service addresses and
carries each connection to the pod behind the Service (or to a process on the host's loopback). The only
sockets opened in the host's own namespace are on loopback. Linux only; needs CAP_SYS_ADMIN (unshare, setns).
"""
from __future__ import annotations

import ctypes
import os
import selectors
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL("libc.so.6", use_errno=True)
_HOST_NETNS = os.open("/proc/self/ns/net", os.O_RDONLY)  # the namespace this process started in
# Every Service address is local inside a pod: the whole range is on its loopback (Linux makes a prefix on lo
# local, so a listener can bind any address in it).
SERVICE_RANGE = "10.0.0.0/16"

# The pod's first process: loopback up, the range local, the hosts file mounted, then wait for the proxy's
# listeners before exec'ing the component (so its first request to the API server finds them).
_START = ('ip link set lo up && ip addr add 10.0.0.1/16 dev lo && mount --bind "$1" /etc/hosts && '
          ': > "$2.net" && while [ ! -e "$2" ]; do sleep 0.02; done; shift 2; exec "$@"')


class PodError(RuntimeError):
    """A pod could not be set up: the message says which and why."""


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"setns: {os.strerror(errno)}")


def socket_in(netns: int | None) -> socket.socket:
    """A TCP socket of the given network namespace (None: the host's). setns acts on the calling thread only."""
    if netns is None:
        return socket.socket()
    _setns(netns)
    try:
        return socket.socket()
    finally:
        _setns(_HOST_NETNS)


@dataclass
class Pod:
    """One process in its own network and mount namespace. `netns` is an open fd of its network namespace."""

    name: str
    argv: list[str]
    env: dict[str, str]
    workdir: Path
    hosts_file: Path
    labels: dict[str, str] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)   # container port names → numbers
    ip: str = ""                                           # what its Endpoints say (no traffic uses it)
    process: subprocess.Popen | None = None
    netns: int | None = None
    started: float = 0.0

    def start(self, die_with_parent: bool = False) -> Pod:
        self.workdir.mkdir(parents=True, exist_ok=True)
        ready = self.workdir / f"{self.name}.ready"
        ready.unlink(missing_ok=True)
        made = self.workdir / f"{self.name}.ready.net"  # the script's sign that loopback and /etc/hosts are set
        made.unlink(missing_ok=True)
        log = open(self.workdir / f"{self.name}.log", "ab")  # noqa: SIM115 - lives as long as the process
        self.process = subprocess.Popen(
            ["unshare", "--net", "--mount", "--propagation", "private", "--", "sh", "-c", _START, "pod",
             str(self.hosts_file), str(ready), *self.argv],
            env=self.env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            preexec_fn=_die_with_parent if die_with_parent else None)
        log.close()
        deadline = time.monotonic() + 10
        mine = os.stat("/proc/self/ns/net").st_ino
        while time.monotonic() < deadline:  # unshare forks nothing: the pid is the namespace's first process
            try:
                if made.exists() and os.stat(f"/proc/{self.process.pid}/ns/net").st_ino != mine:
                    self.netns = os.open(f"/proc/{self.process.pid}/ns/net", os.O_RDONLY)
                    break
            except FileNotFoundError:
                pass
            if self.process.poll() is not None:
                raise PodError(f"pod {self.name} exited with {self.process.returncode} before its namespace "
                               f"was made; see {self.workdir / (self.name + '.log')}")
            time.sleep(0.01)
        else:
            raise PodError(f"pod {self.name}: no network namespace within 10 s")
        self.started = time.monotonic()
        return self

    def release(self) -> None:
        """Let the component start (after the proxy's listeners in the pod are open)."""
        (self.workdir / f"{self.name}.ready").touch()

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGTERM)
                self.process.wait(timeout=10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(self.process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.process.wait(timeout=5)
        if self.netns is not None:
            os.close(self.netns)
            self.netns = None

    def rss_mib(self) -> float:
        try:
            for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():  # type: ignore[union-attr]
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        except (OSError, AttributeError):
            pass
        return 0.0


# Where a connection goes: (network namespace fd or None for the host's, address, port), or None (refused).
Target = tuple[int | None, str, int]


class Proxy:
    """Listeners in chosen namespaces, each carrying every connection it accepts to a target chosen at accept
    time (so a restarted pod is found again). One thread accepts; each connection gets a thread."""

    def __init__(self) -> None:
        self._selector = selectors.DefaultSelector()
        self._listeners: dict[tuple[int | None, str, int], socket.socket] = {}
        self._lock = threading.Lock()
        self._stopped = False
        self._wake_r, self._wake_w = socket.socketpair()
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._thread = threading.Thread(target=self._serve, name="kube-proxy stand-in", daemon=True)
        self._thread.start()

    def listen(self, netns: int | None, address: str, port: int, target: Callable[[], Target | None]) -> None:
        key = (netns, address, port)
        with self._lock:
            if key in self._listeners:
                return
            if netns is None and not address.startswith("127."):
                raise PodError(f"refusing to listen on {address} in the host's namespace (loopback only)")
            sock = socket_in(netns)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((address, port))
            sock.listen(128)
            sock.setblocking(False)
            self._listeners[key] = sock
            self._selector.register(sock, selectors.EVENT_READ, target)
        self._wake_w.send(b"x")

    def forget(self, netns: int | None) -> None:
        """Close every listener in that namespace (its pod is gone); the host's own stay."""
        if netns is None:
            return
        with self._lock:
            for key in [k for k in self._listeners if k[0] == netns]:
                sock = self._listeners.pop(key)
                self._selector.unregister(sock)
                sock.close()

    def stop(self) -> None:
        self._stopped = True
        self._wake_w.send(b"x")
        self._thread.join(timeout=5)
        with self._lock:
            for sock in self._listeners.values():
                sock.close()
            self._listeners.clear()
            self._selector.close()
            self._wake_r.close()
            self._wake_w.close()

    def _serve(self) -> None:
        while not self._stopped:
            for key, _ in self._selector.select(timeout=1):
                if key.data is None:
                    self._wake_r.recv(4096)
                    continue
                try:
                    conn, _ = key.fileobj.accept()  # type: ignore[union-attr]
                except OSError:
                    continue
                threading.Thread(target=_carry, args=(conn, key.data), daemon=True).start()


def _carry(conn: socket.socket, choose: Callable[[], Target | None]) -> None:
    conn.setblocking(True)
    target = choose()
    if target is None:
        conn.close()
        return
    netns, address, port = target
    try:
        upstream = socket_in(netns)
    except OSError:
        conn.close()
        return
    try:
        upstream.settimeout(5)
        upstream.connect((address, port))
        upstream.settimeout(None)
    except OSError:
        upstream.close()
        conn.close()
        return
    for sock in (conn, upstream):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    pair = selectors.DefaultSelector()
    pair.register(conn, selectors.EVENT_READ, upstream)
    pair.register(upstream, selectors.EVENT_READ, conn)
    open_ends = 2
    try:
        while open_ends:
            for key, _ in pair.select():
                data = key.fileobj.recv(65536)  # type: ignore[union-attr]
                if data:
                    key.data.sendall(data)
                    continue
                open_ends -= 1
                pair.unregister(key.fileobj)
                try:
                    key.data.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
    except OSError:
        pass
    finally:
        pair.close()
        conn.close()
        upstream.close()


def _die_with_parent() -> None:
    _libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
