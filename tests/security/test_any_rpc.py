"""Every unary RPC of SchedulerService and SignalService (and Subscribe, SubmitStream), driven by hypothesis
with requests built from the protos' own descriptors: random and boundary values in every
field (empty, huge, negative, NaN, far-future timestamps, unknown enum numbers, oversized
payloads, SQL metacharacters), and raw bytes that are no valid message at all (invalid UTF-8
in a string field among them: protobuf refuses to build that on the client, so it is sent
through identity serializers). Every call ends OK or with a clear status and message, never
UNKNOWN or INTERNAL; a refused call stores nothing; the service is healthy afterwards."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import grpc
import psycopg
from google.protobuf import descriptor, message
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from lowtide_proto.lowtide.v1 import scheduler_pb2, signal_pb2
from scheduler_service.server import Scheduler
from signal_service.server import SignalServer

FD = descriptor.FieldDescriptor
_CODES = {code.value[0]: code for code in grpc.StatusCode}
MIB = 1024 * 1024
UNCLEAR = (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL)
SQL = ["'", "''; DROP TABLE lowtide.tasks; --", "%s", "%(x)s", "\\", "\\'", '"', "-- x", ";", "$1", "E'\\x00'"]

SCHEDULER = scheduler_pb2.DESCRIPTOR.services_by_name["SchedulerService"]
SIGNAL = signal_pb2.DESCRIPTOR.services_by_name["SignalService"]


def _int(bits: int, signed: bool) -> st.SearchStrategy[int]:
    low, high = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if signed else (0, 2**bits - 1)
    return st.sampled_from([low, high, 0, 1, -1 if signed else 2, 10**12 % high]) | st.integers(low, high)


def _scalar(field: descriptor.FieldDescriptor) -> st.SearchStrategy[Any]:
    t = field.type
    if t == FD.TYPE_STRING:
        return st.sampled_from(["", "x" * 10_000, *SQL]) | st.text(max_size=40)
    if t == FD.TYPE_BYTES:
        return st.sampled_from([b"", b"\x00\xff", b"p" * (MIB + 1)]) | st.binary(max_size=64)
    if t in (FD.TYPE_DOUBLE, FD.TYPE_FLOAT):
        return st.sampled_from([math.nan, math.inf, -math.inf, 0.0, -1.0, 1e308]) | st.floats(width=32)
    if t == FD.TYPE_BOOL:
        return st.booleans()
    if t == FD.TYPE_ENUM:
        # Unknown numbers included: proto3 enums are open.
        return st.integers(-5, 120)
    if t in (FD.TYPE_INT32, FD.TYPE_SINT32, FD.TYPE_SFIXED32):
        return _int(32, True)
    if t in (FD.TYPE_UINT32, FD.TYPE_FIXED32):
        return _int(32, False)
    if t in (FD.TYPE_UINT64, FD.TYPE_FIXED64):
        return _int(64, False)
    return _int(64, True)


def _timestamp_like(name: str) -> st.SearchStrategy[dict[str, int]]:
    # Timestamps and Durations: far past and future, negative, and nanos out of range.
    seconds = st.sampled_from([-(2**62), -1, 0, 1, 253_402_300_799, 253_402_300_800, 2**62]) | st.integers(
        -(10**11), 10**11
    )
    return st.fixed_dictionaries({"seconds": seconds, "nanos": st.integers(-(2 * 10**9), 2 * 10**9)})


@st.composite
def _message(draw: st.DrawFn, desc: descriptor.Descriptor, depth: int = 0) -> message.Message:
    from google.protobuf import message_factory

    msg: message.Message = message_factory.GetMessageClass(desc)()
    if desc.full_name in ("google.protobuf.Timestamp", "google.protobuf.Duration"):
        for key, value in draw(_timestamp_like(desc.full_name)).items():
            setattr(msg, key, value)
        return msg
    for field in desc.fields:
        if not draw(st.booleans()):
            continue
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            key_field, value_field = (
                field.message_type.fields_by_name["key"],
                field.message_type.fields_by_name["value"],
            )
            for _ in range(draw(st.integers(0, 2))):
                if value_field.message_type is None:
                    getattr(msg, field.name)[draw(_scalar(key_field))] = draw(_scalar(value_field))
            continue
        if field.message_type is not None:
            if depth >= 3:
                continue
            if field.is_repeated:
                for _ in range(draw(st.integers(0, 3))):
                    getattr(msg, field.name).add().CopyFrom(draw(_message(field.message_type, depth + 1)))
            else:
                getattr(msg, field.name).CopyFrom(draw(_message(field.message_type, depth + 1)))
            continue
        if field.is_repeated:
            getattr(msg, field.name).extend(draw(st.lists(_scalar(field), max_size=3)))
        else:
            setattr(msg, field.name, draw(_scalar(field)))
    return msg


def _raw(desc: descriptor.Descriptor) -> st.SearchStrategy[bytes]:
    """Bytes no client library would send: garbage, truncated varints, and a string field 1
    holding invalid UTF-8 (every request with a string has one at a low number)."""
    bad_utf8 = st.sampled_from([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"a\x80b"])
    string_fields = [f.number for f in desc.fields if f.type == FD.TYPE_STRING]
    invalid: st.SearchStrategy[bytes] = st.nothing()
    if string_fields:
        invalid = st.builds(
            lambda number, text: bytes([(number << 3) | 2, len(text)]) + text, st.sampled_from(string_fields), bad_utf8
        )
    return invalid | st.binary(max_size=32) | st.just(b"\x08") | st.just(b"\x0a\xff\xff\xff\xff\x0f")


@st.composite
def _calls(draw: st.DrawFn, service: descriptor.ServiceDescriptor) -> tuple[descriptor.MethodDescriptor, bytes]:
    method = draw(st.sampled_from(list(service.methods)))
    if draw(st.integers(0, 4)) == 0:
        return method, draw(_raw(method.input_type))
    return method, draw(_message(method.input_type)).SerializeToString()


async def _stored(database_url: str) -> tuple[Any, ...]:
    """What a refused call must not change: rows stored and the settings RPCs change. Counts,
    not contents, because timeouts and dispatch move accepted tasks along meanwhile."""
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT (SELECT count(*) FROM lowtide.tasks), (SELECT count(*) FROM lowtide.schedules),"
            " (SELECT count(*) FROM lowtide.schedules WHERE paused),"
            " (SELECT count(*) FROM lowtide.queues WHERE paused),"
            " (SELECT count(*) FROM lowtide.signal_history), (SELECT coalesce(sum(version), 0) FROM lowtide.signals)"
        )
        row = await cur.fetchone()
    assert row is not None
    return tuple(row)


async def _call(target: str, service: descriptor.ServiceDescriptor, method: Any, body: bytes) -> tuple[Any, str]:
    path = f"/{service.full_name}/{method.name}"
    async with grpc.aio.insecure_channel(target) as channel:
        try:
            if method.client_streaming:
                # SubmitStream: one request; an answer carries the status SubmitTask would end with.
                decode = scheduler_pb2.SubmitStreamResponse.FromString
                stream = channel.stream_stream(path, response_deserializer=decode)(iter([body]), timeout=3)
                message = await stream.read()
                stream.cancel()
                refused = [a.error for a in getattr(message, "answers", ()) if a.HasField("error")]
                if refused:
                    return _CODES[refused[0].code], refused[0].message
            elif method.server_streaming:
                stream = channel.unary_stream(path)(body, timeout=2)
                async for _ in stream:
                    break
                stream.cancel()
            else:
                await channel.unary_unary(path)(body, timeout=3)
        except grpc.aio.AioRpcError as error:
            return error.code(), error.details() or ""
    return grpc.StatusCode.OK, ""


async def _healthy(target: str) -> bool:
    async with grpc.aio.insecure_channel(target) as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


async def _drive(target: str, database_url: str, service: descriptor.ServiceDescriptor, call: Any) -> None:
    method, body = call
    before = await _stored(database_url)
    code, details = await _call(target, service, method, body)
    event(f"{method.name}: {code.name}")
    assert code not in UNCLEAR, (method.name, code, details)
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        # WaitTask and Subscribe legitimately hold the call open; the client gave up first.
        assert method.name in ("WaitTask", "Subscribe"), (method.name, details)
        return
    if code != grpc.StatusCode.OK:
        assert details.strip(), (method.name, code)
        await asyncio.sleep(0)
        assert await _stored(database_url) == before, (method.name, code, details)


FUZZ = settings(
    max_examples=300,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)


@FUZZ
@given(call=_calls(SCHEDULER))
async def test_any_scheduler_rpc_ends_with_a_clear_status(
    scheduler: Scheduler, database_url: str, call: tuple[Any, bytes]
) -> None:
    await _drive(scheduler.target, database_url, SCHEDULER, call)
    assert await _healthy(scheduler.target)


@FUZZ
@given(call=_calls(SIGNAL))
async def test_any_signal_rpc_ends_with_a_clear_status(
    open_signal: SignalServer, database_url: str, call: tuple[Any, bytes]
) -> None:
    await _drive(open_signal.target, database_url, SIGNAL, call)
    assert await _healthy(open_signal.target)


async def test_streaming_health_and_signal_calls_pass_through_the_guards(
    scheduler: Scheduler, open_signal: SignalServer
) -> None:
    """The undecodable-request guard wraps streaming handlers of both kinds: health's Watch
    (written with context.write) and Subscribe (a generator)."""
    async with grpc.aio.insecure_channel(scheduler.target) as channel:
        watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(), timeout=5)
        first = await watch.read()
        watch.cancel()
    assert first.status == health_pb2.HealthCheckResponse.SERVING
    async with grpc.aio.insecure_channel(open_signal.target) as channel:
        stream = channel.unary_stream(
            "/lowtide.v1.SignalService/Subscribe", response_deserializer=signal_pb2.SubscribeResponse.FromString
        )(signal_pb2.SubscribeRequest(name="price").SerializeToString(), timeout=5)
        state = (await stream.read()).state
        stream.cancel()
        code, details = await _call(open_signal.target, SIGNAL, SIGNAL.methods_by_name["Subscribe"], b"\x0a\x01\xff")
    assert state.name == "price"
    assert (code, "not a valid" in details) == (grpc.StatusCode.INVALID_ARGUMENT, True)
