#!/usr/bin/env python3
"""RSS per idle client connection of a running proxy (issue 14, target 4).

Opens N keep-alive connections (50 at a time), asks one thing on each (`GET /`, HTTP/1.1, or
one HTTP/2 stream), keeps them all open and idle, and prints the proxy's RSS per connection
(RSS growth over the baseline, divided by N). Half of them are opened first and the rest after
SETTLE seconds (default 45: parking takes a second, the allocator's housekeeping longer); the
second half's own cost per connection, which leaves out what the first connections' bursts
left behind, is printed too.

usage: idle_rss.py PID HOST:PORT N {h1,h1tls,h2tls} [SETTLE]
"""
import asyncio
import itertools
import ssl
import struct
import sys

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def tls_context(alpn):
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols([alpn])
    return ctx


def frame(kind, flags, stream, payload=b""):
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


async def ask_h1(reader, writer):
    writer.write(b"GET / HTTP/1.1\r\nHost: demo.local\r\n\r\n")
    await writer.drain()
    got = b""
    while b"\r\n\r\n" not in got:
        got += await reader.read(4096)
    head, _, body = got.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    while len(body) < length:
        body += await reader.read(4096)


async def ask_h2(reader, writer):
    # :method GET, :scheme https, :path /, :authority demo.local (HPACK static-table literals)
    block = b"\x82\x87\x84\x41\x0a" + b"demo.local"
    writer.write(PREFACE + frame(4, 0, 0) + frame(1, 5, 1, block))
    await writer.drain()
    while True:
        head = await reader.readexactly(9)
        length, kind, flags = int.from_bytes(head[:3], "big"), head[3], head[4]
        stream = int.from_bytes(head[5:9], "big") & 0x7FFFFFFF
        await reader.readexactly(length)
        if kind == 4 and not flags & 1:
            writer.write(frame(4, 1, 0))
            await writer.drain()
        if kind == 7:
            raise RuntimeError("GOAWAY")
        if stream == 1 and kind in (0, 1) and flags & 1:
            return


SOURCES = itertools.count()


async def open_one(host, port, mode):
    ctx = None if mode == "h1" else tls_context("h2" if mode == "h2tls" else "http/1.1")
    # Spread over 127.0.0.2-51 when the proxy is on loopback: back-to-back runs of 10,000
    # connections would otherwise run out of ephemeral ports (TIME_WAIT) and open slowly.
    local = (f"127.0.0.{2 + next(SOURCES) % 50}", 0) if host.startswith("127.") else None
    reader, writer = await asyncio.open_connection(
        host, port, ssl=ctx, server_hostname="demo.local" if ctx else None, local_addr=local
    )
    await (ask_h2 if mode == "h2tls" else ask_h1)(reader, writer)
    return writer


async def open_many(host, port, mode, count):
    open_ = []
    while len(open_) < count:
        batch = min(50, count - len(open_))
        open_ += await asyncio.gather(*[open_one(host, port, mode) for _ in range(batch)])
    return open_


async def main():
    pid, address, count, mode = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
    settle = int(sys.argv[5]) if len(sys.argv) > 5 else 45
    host, port = address.rsplit(":", 1)
    port = int(port)
    base = rss_kib(pid)
    idle = await open_many(host, port, mode, count // 2)
    await asyncio.sleep(settle)
    half = rss_kib(pid)
    idle += await open_many(host, port, mode, count - count // 2)
    await asyncio.sleep(settle)
    full = rss_kib(pid)
    print(
        f"{mode}, {count} idle connections, {settle} s after opening each half: "
        f"{(full - base) / count:.2f} KiB each ({base} -> {full} KiB), "
        f"the second half {(full - half) / (count - count // 2):.2f} KiB each"
    )
    for writer in idle:
        writer.close()


asyncio.run(main())
