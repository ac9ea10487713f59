"""A loopback server that counts who reached it: the witness of every "no network" test.

A sandbox that claims no network must not reach the host's loopback, the
address a naive network namespace (or none) leaves open. The conformance
rule and the providers' own attack tests all need the same witness: a TCP
server on ``127.0.0.1`` that records every connection while the code under
test tries its ways out. One implementation, so every suite asks the same
question the same way.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import attrs

__all__ = ["LoopbackListener", "loopback_listener"]


@attrs.define
class LoopbackListener:
    """A running witness: its port, and how many connections it accepted.

    Attributes:
        port: The TCP port on ``127.0.0.1`` to aim at.
        accepted: Connections accepted so far (each closed at once).
    """

    port: int
    accepted: int = 0


@contextmanager
def loopback_listener() -> Iterator[LoopbackListener]:
    """Listen on a free ``127.0.0.1`` port in a thread until the block ends.

    Read ``accepted`` after the block (a connection in flight may need a
    moment to reach ``accept``: sleep briefly before leaving it).
    """
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.05)
    listener = LoopbackListener(server.getsockname()[1])
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                connection, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            listener.accepted += 1
            connection.close()

    thread = threading.Thread(target=accept, name="corral-loopback-witness", daemon=True)
    thread.start()
    try:
        yield listener
    finally:
        stop.set()
        thread.join()
        server.close()
