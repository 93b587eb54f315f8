"""A TCP proxy that holds every chunk for a while each way: a database across a network.

    python -m benchmarks.latency --to 127.0.0.1:5432 --rtt 1.0

prints the port it listens on (127.0.0.1) and forwards each connection to ``--to``,
delivering what either side sends half of ``--rtt`` milliseconds later, in order.
``python -m benchmarks --rtt MS`` runs one in front of the PostgreSQL server, so the
PostgreSQL rows show what round trips cost where the server is another machine (on
loopback a round trip is cheap beside the server's own work). It runs in a process of
its own, so its work does not share the benchmark's interpreter; a thread sleeps out
each chunk's delay, so what it adds is that delay and a thread wake-up or two: the
benchmark measures the round trip it got and prints that.
"""

from __future__ import annotations

import argparse
import contextlib
import queue
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator


def _pump(source: socket.socket, target: socket.socket, delay: float) -> None:
    """Forward ``source`` to ``target``, each chunk ``delay`` seconds after it arrived: a
    reader and a writer thread, so a held chunk never holds up the next one's arrival."""
    held: queue.SimpleQueue[tuple[float, bytes]] = queue.SimpleQueue()

    def deliver() -> None:
        with contextlib.suppress(OSError):
            while True:
                due, chunk = held.get()
                if not chunk:
                    break
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                target.sendall(chunk)
        with contextlib.suppress(OSError):
            target.shutdown(socket.SHUT_WR)

    threading.Thread(target=deliver, daemon=True).start()
    chunk = b"-"
    with contextlib.suppress(OSError):
        while chunk:
            chunk = source.recv(65536)
            held.put((time.monotonic() + delay, chunk))
    held.put((0.0, b""))


def _serve(host: str, port: int, delay: float) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    print(listener.getsockname()[1], flush=True)
    while True:
        client, _ = listener.accept()
        try:
            server = socket.create_connection((host, port))
        except OSError:
            client.close()
            continue
        for sock in (client, server):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for a, b in ((client, server), (server, client)):
            threading.Thread(target=_pump, args=(a, b, delay), daemon=True).start()


@contextlib.contextmanager
def proxy(host: str, port: int, rtt_ms: float) -> Iterator[int]:
    """Run the proxy in a child process for the block; the port it listens on."""
    child = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.latency", "--to", f"{host}:{port}",
         "--rtt", str(rtt_ms)],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        if not line.strip().isdigit():
            raise RuntimeError(f"the latency proxy did not start (it printed {line!r})")
        yield int(line)
    finally:
        child.terminate()
        child.wait(10)
        if child.stdout is not None:
            child.stdout.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.latency")
    parser.add_argument("--to", required=True, help="HOST:PORT of the server")
    parser.add_argument("--rtt", type=float, required=True, help="round trip added, in ms")
    args = parser.parse_args(argv)
    host, _, port = args.to.rpartition(":")
    with contextlib.suppress(KeyboardInterrupt):
        _serve(host, int(port), args.rtt / 2000)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
