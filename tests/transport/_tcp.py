"""Two real TCP transports' ends in one process: a loopback connection, no bootstrap."""

from __future__ import annotations

import socket

from unison.transport.base import Events


def tcp_pair() -> tuple[socket.socket, socket.socket]:
    """Both ends of one loopback TCP connection."""
    with socket.create_server(("127.0.0.1", 0)) as srv:
        a = socket.create_connection(srv.getsockname())
        b, _ = srv.accept()
    return a, b


def no_events() -> Events:
    """Transport events nobody listens to."""
    return Events(peer_lost=lambda peer, reason, graceful: None, abort=lambda peer, info: None)
