"""specdec.redis_server.free_port: ports for servers started a little later are picked below the kernel's ephemeral
range (a kernel-chosen port can be taken by an outgoing connection before the server binds it), are bindable, and
are not handed out twice by one process; forked processes do not share the choice."""

from __future__ import annotations

import os
import socket

from specdec import redis_server
from specdec.redis_server import LISTEN_PORT_FLOOR, LOOPBACK, free_port


def test_ports_are_below_the_ephemeral_range_bindable_and_unique():
    floor = redis_server._ephemeral_floor()
    ports = [free_port() for _ in range(64)]
    assert len(set(ports)) == len(ports)
    assert all(LISTEN_PORT_FLOOR <= p < floor for p in ports)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, ports[-1]))  # free right now


def test_a_port_in_use_is_skipped(monkeypatch):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind((LOOPBACK, 0))
        busy.listen()
        taken = busy.getsockname()[1]
        picks = iter([taken, taken + 1 if taken + 1 < 65536 else taken - 1])
        monkeypatch.setattr(redis_server._PORT_PICKER, "randrange", lambda lo, hi: next(picks))
        monkeypatch.setattr(redis_server, "_ephemeral_floor", lambda: 65536)
        assert free_port() != taken


def test_forked_processes_pick_apart():
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its first pick, to the parent
        os.close(read)
        os.write(write, str(free_port()).encode())
        os._exit(0)
    os.close(write)
    mine = [free_port() for _ in range(4)]
    child = int(os.read(read, 16).decode())
    os.waitpid(pid, 0)
    os.close(read)
    assert child not in mine  # a shared random state would replay the same sequence
