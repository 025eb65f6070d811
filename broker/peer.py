"""A broker's own client for talking to another broker (replica fetches,
OffsetForLeaderEpoch, ListOffsets).

In: the other broker's address and kio request payloads. Out: kio response
payloads, one request at a time per connection; a `PeerError` when the
connection fails or times out (the caller backs off and retries, as Kafka's
replica fetcher does).
"""

from __future__ import annotations

import asyncio
import struct

from kio.index import load_response_schema
from kio.serial import entity_reader

from .codec import build, encode_request


class PeerError(Exception):
    """The other broker could not be reached or did not answer in time."""


class PeerConnection:
    def __init__(self, host: str, port: int, client_id: str):
        self.host, self.port = host, port
        self.client_id = client_id
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._correlation = 0

    async def _connect(self, timeout: float) -> None:
        try:
            self._reader, self._writer = await asyncio.wait_for(
                asyncio.open_connection(self.host, self.port, limit=1 << 22), timeout)
        except (OSError, asyncio.TimeoutError) as exc:
            raise PeerError(f"cannot connect to {self.host}:{self.port}: {exc or type(exc).__name__}") from None

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None

    async def request(self, schema: type, fields: dict, timeout: float):
        """Send `schema` (a kio request class) built from `fields`; return the decoded response."""
        if self._writer is None:
            await self._connect(timeout)
        self._correlation += 1
        frame = encode_request(build(schema, fields), self._correlation, self.client_id)
        try:
            self._writer.write(struct.pack(">i", len(frame)) + frame)
            await self._writer.drain()
            (size,) = struct.unpack(">i", await asyncio.wait_for(self._reader.readexactly(4), timeout))
            data = await asyncio.wait_for(self._reader.readexactly(size), timeout)
        except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError) as exc:
            self.close()
            raise PeerError(f"{self.host}:{self.port} did not answer: {exc or type(exc).__name__}") from None
        response_cls = load_response_schema(schema.__api_key__, schema.__version__)
        header_reader = entity_reader(response_cls.__header_schema__)
        resp_header, used = header_reader(data, 0)
        if resp_header.correlation_id != self._correlation:
            self.close()
            raise PeerError(f"{self.host}:{self.port} answered correlation id {resp_header.correlation_id}, "
                            f"expected {self._correlation}")
        body, _ = entity_reader(response_cls)(data, used)
        return body
