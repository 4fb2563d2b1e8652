"""Unit tests of the server-timing trailer: encoding, the fast and general parsers, the batch entry."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from netgain.contract.phases import (
    PHASES,
    TrailerEncoder,
    encode_phases,
    encode_server_timing,
    parse_batch,
    parse_server_timing,
    parse_trailer,
    parse_trailer_general,
)


class TestServerTiming:
    def test_encode_format(self) -> None:
        value = encode_server_timing({"queue": 120_000, "pre": 480_000, "total": 1_234_567})
        assert value == "queue;dur=0.120, pre;dur=0.480, total;dur=1.235"

    @settings(max_examples=100, deadline=None)
    @given(st.dictionaries(st.sampled_from([*PHASES, "total"]), st.integers(0, 10**11), min_size=1))
    def test_round_trip(self, spans: dict[str, int]) -> None:
        parsed = parse_server_timing(encode_server_timing(spans))
        assert set(parsed) == set(spans)
        for name, ns in spans.items():
            assert parsed[name] == pytest.approx(ns / 1e6, abs=0.0006)

    @settings(max_examples=100, deadline=None)
    @given(st.lists(st.integers(0, 10**11), min_size=len(PHASES) + 1, max_size=len(PHASES) + 1))
    def test_fast_encoder_matches_general_one(self, values: list[int]) -> None:
        spans = dict(zip([*PHASES, "total"], values, strict=True))
        value = encode_phases(values[:-1], values[-1], 5, 3)
        assert value == encode_server_timing(spans) + ", batch;id=5;size=3"
        assert parse_trailer(value) == (parse_server_timing(encode_server_timing(spans)), (5, 3))

    @settings(max_examples=200, deadline=None)
    @given(
        st.lists(st.integers(0, 10**12), min_size=len(PHASES) + 1, max_size=len(PHASES) + 1),
        st.integers(-1, 10**9),
        st.integers(0, 4096),
    )
    def test_own_trailer_fast_path_equals_general(self, values: list[int], bid: int, size: int) -> None:
        value = encode_phases(values[:-1], values[-1], bid, size)
        assert parse_trailer(value) == parse_trailer_general(value)
        # Anything else, even one character off the exact format, takes the general path.
        spaced = value.replace(", ", ",  ")
        assert parse_trailer(spaced) == parse_trailer_general(value)

    @settings(max_examples=100, deadline=None)
    @given(
        st.lists(
            st.tuples(
                st.lists(st.integers(0, 10**12), min_size=3, max_size=3),  # queue, pre, post
                st.sampled_from([(0, 31_234, 0), (0, 31_235, 0), (1_500, 2_000_500, 999)]),  # a batch's
                st.integers(0, 10**12),
                st.sets(st.sampled_from(PHASES), max_size=2),  # phases a failed request never reached
                st.sampled_from([(7, 32), (8, 32), (8, 5), (-1, 0)]),  # batch id and size
            ),
            max_size=40,
        )
    )
    def test_trailer_encoder_writes_what_encode_phases_writes(self, requests: list) -> None:
        """Batches answered in runs, a device part or batch entry reused or not, requests missing
        phases: the same text, as ASCII bytes."""
        enc = TrailerEncoder()
        for (q, pre, post), (h2d, kernel, d2h), total, missing, (batch_id, size) in requests:
            spans = dict(zip(PHASES, (q, pre, h2d, kernel, d2h, post), strict=True))
            for phase in missing:
                del spans[phase]
            expected = encode_phases([spans.get(k, 0) for k in PHASES], total, batch_id, size)
            assert enc.encode(spans, total, batch_id, size) == expected.encode("ascii")

    def test_parse_w3c_variants(self) -> None:
        value = 'cache;desc="hit", db;dur="53.2";desc=x,  app ; dur = 47.2 ,, '
        assert parse_server_timing(value) == {"db": 53.2, "app": 47.2}

    def test_parse_error_names_the_entry(self) -> None:
        with pytest.raises(ValueError, match=r"'pre;dur=fast'.*not a number"):
            parse_server_timing("queue;dur=0.1, pre;dur=fast")

    def test_batch_entry_and_errors(self) -> None:
        assert parse_batch(encode_phases([0] * len(PHASES), 0, 12, 8)) == (12, 8)
        assert parse_batch("queue;dur=0.1, batch;size=3") == (-1, 3)
        assert parse_batch("queue;dur=0.1") is None
        with pytest.raises(ValueError, match=r"'batch;id=x;size=2'.*not a number"):
            parse_batch("queue;dur=0.1, batch;id=x;size=2")
