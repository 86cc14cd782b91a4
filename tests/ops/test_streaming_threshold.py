"""The streaming-store threshold of the CPU kernels: a quarter of the last-level cache, at least 16 MiB."""
from transformer_engine import _kernels
import conftest


def test_default_is_a_quarter_of_the_last_level_cache_and_at_least_16_mib():
    assert conftest.DEFAULT_STREAMING_STORE_MIN_BYTES == max(16 << 20, _kernels.last_level_cache_bytes() // 4)


def test_settable_and_set_to_16_mib_for_the_tests():
    assert _kernels.streaming_store_min_bytes() == 16 << 20
    previous = _kernels.set_streaming_store_min_bytes(1 << 40)
    try:
        assert previous == 16 << 20 and _kernels.streaming_store_min_bytes() == 1 << 40
    finally:
        _kernels.set_streaming_store_min_bytes(previous)
