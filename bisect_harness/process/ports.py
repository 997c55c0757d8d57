"""A free TCP port for a process to listen on."""

from __future__ import annotations

import socket

__all__ = ["free_port"]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing listens on right now.

    The port is only free at the moment of the call; bind it soon.
    """
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]
