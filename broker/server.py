"""The broker's network side: accept connections, read request frames, answer
them in order, and shut down cleanly.

In: a `BrokerConfig`. Out: a running asyncio server until SIGTERM or SIGINT,
after which every partition is flushed, its segments closed and the recovery
checkpoint written.

Each connection is served one request at a time, as Kafka does (it mutes a
channel while a request is in progress), so responses leave in request
order. A frame that cannot be parsed, is oversized or asks for an
unsupported version closes that connection only; every other connection
keeps being served.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import signal
import struct
import time

from kio.schema.errors import ErrorCode

from .codec import API_VERSIONS_KEY, ProtocolError, UnsupportedVersion, decode_request, encode_response
from .config import LONG_MAX, BrokerConfig
from .handlers import SUPPORTED, Handlers
from .replica_manager import ReplicaManager
from .state import BrokerState

log = logging.getLogger("faultline.broker.server")

WRITE_BUFFER_HIGH = 1 << 20


class BrokerServer:
    def __init__(self, config: BrokerConfig):
        self.config = config
        self.state: BrokerState | None = None
        self.handlers: Handlers | None = None
        self._server: asyncio.base_events.Server | None = None
        self._connections: set[asyncio.Task] = set()
        self._stopping = asyncio.Event()

    async def start(self) -> None:
        started = time.monotonic()
        self.state = BrokerState(self.config)
        self.replicas = ReplicaManager(self.config, self.state)
        self.handlers = Handlers(self.state, self.replicas)
        await self.replicas.connect()
        # Listen before joining the cluster: other brokers may fetch from this one as soon as
        # its registration appears in ZooKeeper.
        self._server = await asyncio.start_server(
            self._accept, self.config.host, self.config.port, reuse_address=True, limit=1 << 20
        )
        await self.replicas.start()
        log.info(
            "broker %d serving on %s:%d (data %s, %d topics recovered in %.0f ms, pid %d)",
            self.config.node_id, self.config.host, self.config.port, self.config.data_dir,
            len(self.state.topics), (time.monotonic() - started) * 1000, os.getpid(),
        )

    def request_stop(self) -> None:
        self._stopping.set()

    async def serve_until_stopped(self) -> None:
        flusher = asyncio.create_task(self._flusher())
        await self._stopping.wait()
        await self.replicas.controlled_shutdown()
        log.info("shutting down: closing the listener and %d connections", len(self._connections))
        flusher.cancel()
        self._server.close()
        for task in list(self._connections):
            task.cancel()
        # Bounded: a shutdown must reach the flush below even if a connection or the cluster
        # session does not let go (the supervisor's SIGKILL would lose unflushed data).
        try:
            await asyncio.wait_for(asyncio.gather(*self._connections, return_exceptions=True), 5)
        except asyncio.TimeoutError:
            log.warning("connections did not close within 5 s; going on")
        try:
            await asyncio.wait_for(self.replicas.stop(), 10)
        except asyncio.TimeoutError:
            log.warning("leaving the cluster took more than 10 s; going on")
        self.state.shutdown()
        log.info("shut down cleanly: all partitions flushed, recovery checkpoint written")

    async def _flusher(self) -> None:
        # As Kafka's LogManager: the time-based flusher wakes every log.flush.scheduler.interval.ms
        # (by default never), whatever log.flush.interval.ms says.
        tick_ms = self.config["log.flush.scheduler.interval.ms"]
        if tick_ms >= LONG_MAX:
            return
        while True:
            await asyncio.sleep(max(tick_ms / 1000, 0.001))
            self.state.flush_due()

    # -- connections -------------------------------------------------------------------

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._connections.add(task)
        peer = writer.get_extra_info("peername")
        try:
            await self._serve(reader, writer, peer)
        except asyncio.CancelledError:
            pass
        finally:
            self._connections.discard(task)
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer) -> None:
        max_size = self.config["socket.request.max.bytes"]
        while True:
            try:
                (size,) = struct.unpack(">i", await reader.readexactly(4))
                if size <= 0 or size > max_size:
                    log.warning("closing %s: request frame of %d bytes (socket.request.max.bytes=%d)",
                                peer, size, max_size)
                    return
                frame = await reader.readexactly(size)
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            response = await self._answer(frame, peer)
            if response is False:
                return
            if response is None:
                continue
            writer.write(response)
            if writer.transport.get_write_buffer_size() > WRITE_BUFFER_HIGH:
                try:
                    await writer.drain()
                except ConnectionError:
                    return

    async def _answer(self, frame: bytes, peer) -> bytes | None | bool:
        """The response frame; None for no response; False to close the connection."""
        try:
            request = decode_request(frame, SUPPORTED)
        except UnsupportedVersion as exc:
            if exc.api_key == API_VERSIONS_KEY:
                # A client newer than this broker: answer v0 with the versions we have.
                body = self.handlers.api_versions_body(ErrorCode.unsupported_version)
                return encode_response(API_VERSIONS_KEY, 0, exc.correlation_id, body)
            log.warning("closing %s: %s", peer, exc)
            return False
        except ProtocolError as exc:
            log.warning("closing %s: %s (frame starts %s)", peer, exc, frame[:96].hex())
            return False
        try:
            result = self.handlers.handle(request)
            if inspect.isawaitable(result):
                result = await result
            if result is None:
                return None
            return encode_response(request.api_key, request.version, request.correlation_id, result)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("closing %s: internal error answering api %d v%d", peer, request.api_key, request.version)
            return False


def run(config: BrokerConfig) -> int:
    """Run the broker in the foreground until SIGTERM or SIGINT. Returns the exit status."""

    async def main() -> None:
        server = BrokerServer(config)
        await server.start()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, server.request_stop)
        await server.serve_until_stopped()

    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(main())
    finally:
        # Worker threads still blocked in a ZooKeeper call must not hold the exit: the logs are
        # flushed and the checkpoint written, so the process may end now.
        loop.close()
    return 0
