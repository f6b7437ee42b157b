"""The one owner of each cross-cutting concept (issue 52): the bounded cache, the float
orderings, the first-parent walk, the remote layout map. Each was written several times
before, and the copies disagreed in places (one ordering mapped -0.0 apart from +0.0)."""

import threading

import numpy as np
import pytest
import torch

from wvc.formats.dtypes import ulp_position, value_order
from wvc.lru import LRUCache
from wvc.model.versions import first_parents
from wvc.remotes import layout


def test_an_lru_cache_bounded_in_bytes_drops_the_least_recently_used_first():
    cache = LRUCache(10, weight=len)
    cache.put("a", b"1234")
    cache.put("b", b"1234")
    assert cache.get("a") == b"1234"  # now the most recently used
    cache.put("c", b"1234")  # 12 bytes: "b", the least recently used, goes
    assert "b" not in cache and "a" in cache and "c" in cache and cache.size == 8
    cache.put("a", b"12")  # a new value replaces the old one's weight
    assert cache.size == 6 and cache["a"] == b"12"
    cache.put("huge", b"x" * 11)  # heavier than the whole limit: not kept, nothing dropped
    assert "huge" not in cache and len(cache) == 2
    with pytest.raises(KeyError):
        cache["b"]


def test_an_lru_cache_by_count_and_get_or_make_counts_what_it_made():
    cache = LRUCache(2)
    made = [cache.get_or_make(k, lambda k=k: k * 2) for k in (1, 2, 1, 3)]
    assert made == [2, 4, 2, 6] and cache.made == 3  # the second 1 was a hit
    assert 2 not in cache and 1 in cache and 3 in cache  # 2 was the least recently used
    assert cache.get(2, "absent") == "absent"


def test_an_lru_cache_shared_by_threads_stays_within_its_limit():
    cache = LRUCache(1000, weight=len)

    def fill(k):
        for i in range(2000):
            cache.put((k, i), b"x" * (i % 37))
            cache.get((k, i // 2))

    threads = [threading.Thread(target=fill, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert cache.size <= 1000 and cache.size == sum(len(cache[k]) for k in list(cache._items))


@pytest.mark.parametrize("bits,signed,unsigned", [(8, np.int8, np.uint8), (16, np.int16, np.uint16),
                                                  (32, np.int32, np.uint32)])
def test_value_order_is_an_involution_in_the_values_order_on_signed_and_unsigned_views(bits, signed, unsigned):
    if bits == 8:
        patterns = np.arange(256, dtype=np.uint8)
    else:
        rng = np.random.default_rng(bits)
        patterns = rng.integers(0, 1 << bits, size=20000, dtype=np.uint64).astype(unsigned)
    with np.errstate(invalid="ignore"):
        values = _values(bits, patterns)
    finite = np.isfinite(values)
    _check(bits, signed, patterns, values, finite)


def _values(bits, patterns):
    return {16: lambda u: torch.from_numpy(u.view(np.int16).copy()).view(torch.bfloat16).float().numpy(),
              32: lambda u: u.view(np.float32).astype(np.float64, casting="unsafe"),
              8: lambda u: torch.from_numpy(u.view(np.int8).copy()).view(torch.float8_e4m3fn).float().numpy()}[bits](patterns)


def _check(bits, signed, patterns, values, finite):
    as_signed = patterns.view(signed).astype(np.int64)
    as_unsigned = patterns.astype(np.int64)
    ordered = value_order(as_signed, bits)
    # the signed and the unsigned views give the same bits
    assert np.array_equal(ordered & ((1 << bits) - 1), value_order(as_unsigned, bits) & ((1 << bits) - 1))
    assert np.array_equal(value_order(ordered, bits), as_signed)  # an involution
    order = np.argsort(ordered[finite], kind="stable")
    assert np.all(np.diff(values[finite][order]) >= 0)  # sorted by it, the values are sorted


def test_ulp_position_puts_both_zeros_at_zero_and_counts_units_in_the_last_place():
    bits = np.array([0x0000, 0x8000, 0x0001, 0x8001, 0x3F80, 0x3F81, 0xBF80], dtype=np.uint16).view(np.int16)
    pos = ulp_position(bits.astype(np.int64), 16)
    assert list(pos[:4]) == [0, 0, 1, -1]  # +0.0, -0.0, the smallest subnormals
    assert pos[5] - pos[4] == 1 and pos[6] == -pos[4]  # 1.0 and its next bf16; -1.0
    t = torch.from_numpy(bits.copy())
    assert torch.equal(ulp_position(t, 16).to(torch.int64), torch.from_numpy(pos))  # torch and numpy alike


def test_first_parents_walks_first_parents_newest_first_within_a_limit():
    class C:
        def __init__(self, parents):
            self.parents = parents

    graph = {"d": C(["c", "x"]), "c": C(["b"]), "b": C(["a"]), "a": C([]), "x": C(["a"])}
    assert first_parents(graph.__getitem__, "d") == ["d", "c", "b", "a"]
    assert first_parents(graph.__getitem__, "d", 2) == ["d", "c"]
    assert first_parents(graph.__getitem__, None) == []


def test_the_layout_map_builds_what_it_recognises():
    h = "ab" * 32
    assert layout.commit_of_step_path(layout.step_path(h)) == h
    assert layout.commit_of_step_path(f"steps/{h}.stepx") is None and layout.commit_of_step_path("steps/ab.step") is None
    record = layout.new_record_name(now=1_700_000_000)
    assert layout.record_of_name(layout.retired_path(record).rpartition("/")[2]) == record
    assert layout.record_time(layout.pruned_path(record)) == 1_700_000_000
    named = layout.sorted_listing([layout.catalog_path(h), layout.retired_path(record), layout.pruned_path(record),
                                   layout.pack_path(h, "idx"), layout.pack_path(h), layout.attic_path(layout.catalog_path(h))])
    assert named == {"catalog": [h], "retired": [record], "pruned": [record], "idx": [h]}  # the attic is not listed
    assert layout.movable(layout.pack_path(h)) and not layout.movable(layout.step_path(h))
