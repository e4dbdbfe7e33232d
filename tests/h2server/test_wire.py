"""lowtide.h2server.wire: gRPC's rules on top of HTTP/2 as pure functions, checked without a socket."""

from __future__ import annotations

import base64
import gzip
import itertools
import urllib.parse
import zlib

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lowtide.h2server import wire

# grpc-timeout


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("1H", 3600.0),
        ("2M", 120.0),
        ("3S", 3.0),
        ("250m", 0.25),
        ("1500u", 0.0015),
        ("7n", 7e-9),
        ("0S", 0.0),
        ("99999999S", 99999999.0),  # 8 digits, the most the protocol allows
        ("00000001m", 0.001),
    ],
)
def test_timeout_is_digits_and_a_unit(value: str, seconds: float) -> None:
    assert wire.timeout(value) == pytest.approx(seconds)


@pytest.mark.parametrize(
    "value",
    [
        "",
        "S",
        "5",
        "5s",  # units are case-sensitive: "s" is not one
        "5x",
        "123456789S",  # 9 digits
        "-1S",
        "+1S",
        "1.5S",
        " 1S",
        "1 S",
        "1e3m",
        "²S",  # a digit to str.isdigit, not an ASCII digit (the header is read as latin-1)
        "¹²S",
    ],
)
def test_a_malformed_timeout_is_a_wire_error_internal(value: str) -> None:
    with pytest.raises(wire.WireError) as raised:
        wire.timeout(value)
    assert raised.value.code == grpc.StatusCode.INTERNAL
    assert repr(value) in str(raised.value)


# grpc-message


@pytest.mark.parametrize(
    ("message", "escaped"),
    [
        ("", ""),
        ("plain ASCII, punctuation: !\"#$&'()*+,-./:;<=>?@[\\]^_`{|}~", None),
        ("100%", "100%25"),
        ("%25", "%2525"),
        ("line\nbreak\ttab", "line%0Abreak%09tab"),
        ("\x7f\x1f", "%7F%1F"),
        ("température > 400 °C", "temp%C3%A9rature > 400 %C2%B0C"),
        ("😀", "%F0%9F%98%80"),
    ],
)
def test_grpc_message_escapes_percent_and_everything_outside_printable_ascii(message: str, escaped: str | None) -> None:
    result = wire.escape(message)
    assert result == (message if escaped is None else escaped)
    assert result.isascii()
    assert all(0x20 <= ord(c) <= 0x7E for c in result)


@given(st.text())
@settings(deadline=None)
def test_grpc_message_escape_round_trips_through_percent_decoding(message: str) -> None:
    # Lone surrogates cannot be encoded as UTF-8 at all; they are not a message anyone sends.
    try:
        message.encode()
    except UnicodeEncodeError:
        return
    assert urllib.parse.unquote(wire.escape(message), errors="strict") == message


# Metadata


def _b64(data: bytes, *, padded: bool) -> bytes:
    encoded = base64.b64encode(data)
    return encoded if padded else encoded.rstrip(b"=")


def test_metadata_skips_pseudo_and_transport_headers_and_keeps_the_rest_in_order() -> None:
    headers = [
        (b":method", b"POST"),
        (b":path", b"/test.Echo/Unary"),
        (b":authority", b"localhost"),
        (b":scheme", b"http"),
        (b"content-type", b"application/grpc"),
        (b"te", b"trailers"),
        (b"grpc-timeout", b"1S"),
        (b"grpc-encoding", b"gzip"),
        (b"grpc-accept-encoding", b"identity,gzip"),
        (b"x-first", b"one"),
        (b"user-agent", b"grpc-python/1.0"),
        (b"x-first", b"two"),
        (b"x-latin", "caf\xe9".encode("latin-1")),
    ]
    assert wire.metadata(headers) == (
        ("x-first", "one"),
        ("user-agent", "grpc-python/1.0"),
        ("x-first", "two"),
        ("x-latin", "caf\xe9"),
    )


@pytest.mark.parametrize("data", [b"", b"\x00", b"\x00\xff", b"\x00\xff\x10", b"\xde\xad\xbe\xef", bytes(range(256))])
@pytest.mark.parametrize("padded", [True, False])
def test_bin_metadata_is_base64_decoded_with_or_without_padding(data: bytes, padded: bool) -> None:
    assert wire.metadata([(b"x-data-bin", _b64(data, padded=padded))]) == (("x-data-bin", data),)


def test_bin_metadata_values_joined_by_commas_are_separate_values() -> None:
    joined = b", ".join(
        [_b64(b"\x01", padded=False), _b64(b"\x02\x03", padded=True), _b64(b"\x04\x05\x06", padded=False)]
    )
    assert wire.metadata([(b"x-data-bin", joined)]) == (
        ("x-data-bin", b"\x01"),
        ("x-data-bin", b"\x02\x03"),
        ("x-data-bin", b"\x04\x05\x06"),
    )


def test_bin_metadata_that_is_not_base64_is_a_value_error() -> None:
    # The server answers such a request INTERNAL ("bad request headers").
    with pytest.raises(ValueError):
        wire.metadata([(b"x-data-bin", b"A")])


def test_metadata_headers_lowercase_keys_and_send_bin_values_as_unpadded_base64() -> None:
    headers = wire.metadata_headers(
        [
            ("X-Text", "hello"),
            ("x-bytes-as-text", b"from bytes"),
            ("x-one-bin", b"\x00"),
            ("X-Two-Bin", b"\x00\xff"),
            ("x-str-bin", "text in a bin key"),
        ]
    )
    assert headers == [
        (b"x-text", b"hello"),
        (b"x-bytes-as-text", b"from bytes"),
        (b"x-one-bin", b"AA"),
        (b"x-two-bin", b"AP8"),
        (b"x-str-bin", base64.b64encode(b"text in a bin key").rstrip(b"=")),
    ]
    assert wire.metadata_headers(None) == []
    assert wire.metadata_headers(()) == []


_NAME = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789", min_size=1, max_size=8)


@given(
    st.lists(
        st.one_of(
            st.tuples(_NAME.map(lambda name: f"x-{name}-bin"), st.binary(max_size=40)),
            st.tuples(
                _NAME.map(lambda name: f"x-{name}"),
                st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=40),
            ),
        ),
        max_size=6,
    )
)
@settings(max_examples=100, deadline=None)
def test_metadata_headers_and_metadata_round_trip(items: list[tuple[str, str | bytes]]) -> None:
    assert wire.metadata(wire.metadata_headers(items)) == tuple(items)


# Messages


def _framed(messages: list[bytes]) -> bytes:
    return b"".join(wire.frame(message) for message in messages)


def _read(reader: wire.MessageReader, chunks: list[bytes]) -> list[bytes]:
    return [message for chunk in chunks for message in reader.feed(chunk)]


_MESSAGES = [b"", b"a", b"hello world", bytes(range(256)) * 300, b"\x00" * 5, b"last"]


def test_frame_is_the_flag_the_big_endian_length_and_the_message() -> None:
    assert wire.frame(b"abc") == b"\x00\x00\x00\x00\x03abc"
    assert wire.frame(b"") == b"\x00\x00\x00\x00\x00"
    assert wire.frame(b"x" * 0x010203)[:5] == b"\x00\x00\x01\x02\x03"


def test_message_reader_one_byte_at_a_time() -> None:
    data = _framed(_MESSAGES)
    reader = wire.MessageReader(None)
    assert _read(reader, [data[i : i + 1] for i in range(len(data))]) == _MESSAGES
    assert not reader.partial


def test_message_reader_all_at_once_and_partial_inside_a_message() -> None:
    reader = wire.MessageReader(None)
    assert _read(reader, [_framed(_MESSAGES)]) == _MESSAGES
    assert not reader.partial
    # Only the prefix, then half the message: nothing yet, and the reader says it is inside one.
    framed = wire.frame(b"0123456789")
    assert _read(reader, [framed[:3]]) == []
    assert reader.partial
    assert _read(reader, [framed[3:10]]) == []
    assert reader.partial
    assert _read(reader, [framed[10:]]) == [b"0123456789"]
    assert not reader.partial


@given(st.data())
@settings(max_examples=200, deadline=None)
def test_message_reader_cuts_messages_across_arbitrary_chunk_boundaries(data: st.DataObject) -> None:
    messages = [*data.draw(st.lists(st.binary(max_size=300), max_size=8)), bytes(range(256)) * 80]
    framed = _framed(messages)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(framed)), max_size=30)))
    bounds = [0, *cuts, len(framed)]
    chunks = [framed[a:b] for a, b in itertools.pairwise(bounds)]
    reader = wire.MessageReader(None)
    assert _read(reader, chunks) == messages
    assert not reader.partial


@pytest.mark.parametrize(("encoding", "compress"), [("gzip", gzip.compress), ("deflate", zlib.compress)])
def test_a_compressed_message_is_decompressed(encoding: str, compress: object) -> None:
    assert callable(compress)
    original = b"temperature reading " * 5000
    packed: bytes = compress(original)
    assert len(packed) < len(original) // 10
    data = wire.PREFIX.pack(True, len(packed)) + packed + wire.frame(b"plain, in the same stream")
    reader = wire.MessageReader(encoding)
    # Split inside the compressed message too.
    assert _read(reader, [data[:7], data[7:100], data[100:]]) == [original, b"plain, in the same stream"]


def test_an_uncompressed_message_passes_through_a_reader_with_an_encoding() -> None:
    reader = wire.MessageReader("gzip")
    assert _read(reader, [wire.frame(b"not compressed")]) == [b"not compressed"]


def test_a_message_over_the_limit_is_resource_exhausted_as_soon_as_its_prefix_arrives() -> None:
    reader = wire.MessageReader(None, limit=100)
    assert _read(reader, [wire.frame(b"x" * 100)]) == [b"x" * 100]
    with pytest.raises(wire.WireError) as raised:
        # Only the prefix announcing 101 bytes: no need to wait for (and buffer) the rest.
        _read(reader, [wire.PREFIX.pack(False, 101)])
    assert raised.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "101" in str(raised.value)


def test_the_default_limit_is_4_mib() -> None:
    reader = wire.MessageReader(None)
    with pytest.raises(wire.WireError) as raised:
        _read(reader, [wire.PREFIX.pack(False, 4 * 1024 * 1024 + 1)])
    assert raised.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert _read(wire.MessageReader(None), [wire.PREFIX.pack(False, 4 * 1024 * 1024)]) == []


def test_a_compressed_message_that_inflates_over_the_limit_is_resource_exhausted() -> None:
    packed = gzip.compress(b"\x00" * 10_000)
    reader = wire.MessageReader("gzip", limit=1000)
    with pytest.raises(wire.WireError) as raised:
        _read(reader, [wire.PREFIX.pack(True, len(packed)) + packed])
    assert raised.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED


@pytest.mark.parametrize("encoding", [None, "snappy", "br"])
def test_a_compressed_message_in_an_unknown_encoding_is_unimplemented(encoding: str | None) -> None:
    packed = gzip.compress(b"payload")
    reader = wire.MessageReader(encoding)
    with pytest.raises(wire.WireError) as raised:
        _read(reader, [wire.PREFIX.pack(True, len(packed)) + packed])
    assert raised.value.code == grpc.StatusCode.UNIMPLEMENTED


def test_a_compressed_message_that_is_not_gzip_is_internal() -> None:
    reader = wire.MessageReader("gzip")
    with pytest.raises(wire.WireError) as raised:
        _read(reader, [wire.PREFIX.pack(True, 9) + b"not gzip!"])
    assert raised.value.code == grpc.StatusCode.INTERNAL
