"""An HTTP/3 client on aioquic (independent of quinn and h3), for tests/http3.rs.

    h3_client.py HOST PORT SNI CA_FILE REQUESTS_JSON

REQUESTS_JSON is a list of {"method", "path", "authority", "body_size"} sent at once, each on a
stream of its own, over one QUIC connection. Prints one JSON object: "alpn", and "answers", a list
(in request order) of {"status", "headers", "body_len", "body_sha256", "body_head", "sent_sha256"}
or {"error"}. The request body is body_size bytes of a fixed pattern.
"""

import asyncio
import hashlib
import json
import sys

from aioquic.asyncio.client import connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.h3.connection import H3_ALPN, H3Connection
from aioquic.h3.events import DataReceived, HeadersReceived
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.events import StreamReset


def pattern(size):
    block = bytes(range(256)) * 4096
    out = bytearray()
    while len(out) < size:
        out += block[: size - len(out)]
    return bytes(out)


class Client(QuicConnectionProtocol):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.h3 = H3Connection(self._quic)
        self.streams = {}

    def quic_event_received(self, event):
        if isinstance(event, StreamReset) and event.stream_id in self.streams:
            state = self.streams[event.stream_id]
            if not state["done"].done():
                state["done"].set_exception(ConnectionError("stream reset %d" % event.error_code))
            return
        for ev in self.h3.handle_event(event):
            state = self.streams.get(ev.stream_id)
            if state is None:
                continue
            if isinstance(ev, HeadersReceived):
                state["headers"].extend(ev.headers)
            elif isinstance(ev, DataReceived):
                state["body"].extend(ev.data)
            if getattr(ev, "stream_ended", False) and not state["done"].done():
                state["done"].set_result(None)

    async def request(self, method, authority, path, body):
        stream_id = self._quic.get_next_available_stream_id()
        headers = [
            (b":method", method.encode()),
            (b":scheme", b"https"),
            (b":authority", authority.encode()),
            (b":path", path.encode()),
            (b"user-agent", b"aioquic-test"),
        ]
        if body:
            headers.append((b"content-length", str(len(body)).encode()))
        state = {
            "headers": [],
            "body": bytearray(),
            "done": asyncio.get_running_loop().create_future(),
        }
        self.streams[stream_id] = state
        self.h3.send_headers(stream_id, headers, end_stream=not body)
        if body:
            self.h3.send_data(stream_id, body, end_stream=True)
        self.transmit()
        await state["done"]
        fields = {}
        for name, value in state["headers"]:
            fields.setdefault(name.decode(), value.decode(errors="replace"))
        got = bytes(state["body"])
        return {
            "status": int(fields.pop(":status", "0")),
            "headers": fields,
            "body_len": len(got),
            "body_sha256": hashlib.sha256(got).hexdigest(),
            "body_head": got[:200].decode(errors="replace"),
            "sent_sha256": hashlib.sha256(body).hexdigest(),
        }


async def main():
    host, port, sni, ca_file, requests = sys.argv[1:6]
    requests = json.loads(requests)
    config = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN, server_name=sni)
    config.load_verify_locations(ca_file)
    async with connect(host, int(port), configuration=config, create_protocol=Client) as client:
        async def one(r):
            try:
                body = pattern(r.get("body_size", 0))
                return await asyncio.wait_for(
                    client.request(r["method"], r["authority"], r["path"], body), 60
                )
            except Exception as e:  # noqa: BLE001 - reported to the test
                return {"error": repr(e)}

        answers = await asyncio.gather(*(one(r) for r in requests))
        alpn = client._quic.tls.alpn_negotiated
        print(json.dumps({"alpn": alpn, "answers": answers}))


if __name__ == "__main__":
    asyncio.run(main())
