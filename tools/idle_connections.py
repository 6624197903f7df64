#!/usr/bin/env python3
"""Opens N ZeroMQ connections to a data port that send nothing after their
handshake: the hostile client of README "Security" (idle data-plane
connections). Each completes the ZMTP 3.0 NULL handshake as a DEALER and
answers the server's heartbeats, so only the server's own limits end it.
Standard library only, no pyzmq.

Usage: tools/idle_connections.py HOST:PORT N SECONDS [--source IP] [--server-pid PID]
Prints once a second how many of its connections are still open (with
--server-pid, also that process's resident memory and open descriptors, as
before they opened), and at the end how many the server closed
(docs/performance.md, "Idle connections").
"""
import argparse
import os
import selectors
import socket
import struct
import sys
import time

GREETING = (b"\xff" + b"\x00" * 8 + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\x00") + b"\x00" + b"\x00" * 31)
READY_BODY = b"\x05READY" + b"\x0bSocket-Type" + struct.pack(">I", 6) + b"DEALER"
READY = b"\x04" + bytes([len(READY_BODY)]) + READY_BODY


class Connection:
    def __init__(self, sock):
        self.sock = sock
        self.inbox = b""
        self.greeted = False

    def take(self, data):
        """Consumes what the server sent; returns the bytes to answer."""
        self.inbox += data
        out = b""
        if not self.greeted:
            if len(self.inbox) < 64:
                return out
            self.inbox = self.inbox[64:]
            self.greeted = True
        while self.inbox:
            flags = self.inbox[0]
            head = 9 if flags & 0x02 else 2
            if len(self.inbox) < head:
                break
            size = struct.unpack(">Q", self.inbox[1:9])[0] if flags & 0x02 else self.inbox[1]
            if len(self.inbox) < head + size:
                break
            body, self.inbox = self.inbox[head:head + size], self.inbox[head + size:]
            if flags & 0x04 and body.startswith(b"\x04PING") and len(body) >= 7:
                pong = b"\x04PONG" + body[7:]  # the ping's context, after its TTL
                out += b"\x04" + bytes([len(pong)]) + pong
        return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("address")
    parser.add_argument("count", type=int)
    parser.add_argument("seconds", type=float)
    parser.add_argument("--source", default=None, help="local IP to connect from")
    parser.add_argument("--server-pid", type=int, default=None, help="report this process's RSS and descriptors")
    args = parser.parse_args()

    def server():
        if args.server_pid is None:
            return ""
        with open(f"/proc/{args.server_pid}/status") as f:
            rss = next(line.split()[1] for line in f if line.startswith("VmRSS:"))
        fds = len(os.listdir(f"/proc/{args.server_pid}/fd"))
        return f", server RSS {int(rss) / 1024:.1f} MiB, {fds} descriptors"

    print(f"before{server()}", flush=True)
    host, port = args.address.replace("tcp://", "").rsplit(":", 1)
    selector = selectors.DefaultSelector()
    opened = 0
    for _ in range(args.count):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if args.source:
            s.bind((args.source, 0))
        try:
            s.connect((host, int(port)))
        except OSError as e:
            print(f"connect: {e}", file=sys.stderr)
            s.close()
            continue
        s.sendall(GREETING + READY)
        s.setblocking(False)
        selector.register(s, selectors.EVENT_READ, Connection(s))
        opened += 1
    print(f"opened {opened}", flush=True)
    start = time.monotonic()
    next_report = start + 1
    while time.monotonic() - start < args.seconds:
        for key, _ in selector.select(timeout=0.2):
            c = key.data
            try:
                data = c.sock.recv(65536)
            except OSError:
                data = b""
            if not data:
                selector.unregister(c.sock)
                c.sock.close()
                continue
            reply = c.take(data)
            if reply:
                try:
                    c.sock.sendall(reply)
                except OSError:
                    pass
        if time.monotonic() >= next_report:
            next_report += 1
            print(f"{time.monotonic() - start:5.1f} s: {len(selector.get_map())} open{server()}", flush=True)
    print(f"closed by the server: {opened - len(selector.get_map())} of {opened}", flush=True)


if __name__ == "__main__":
    main()
