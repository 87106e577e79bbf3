"""`IdMap`: the user's ids (int64, or UTF-8 strings as fixed-width bytes) to node
positions, equal to a dict lookup on random data, whatever the width and form the
queries come in, with hash collisions forced; unknown ids are -1, or named."""
import numpy as np
import pytest

from jgraph.data import ids as ids_module
from jgraph.data.graph import GraphError
from jgraph.data.ids import IdMap, hash_bytes

# Non-ASCII of 2, 3 and 4 UTF-8 bytes, so that values cross the 8-byte words unevenly.
ALPHABET = list("abcxyz019-_ ,\"") + ["é", "Ø", "李", "ß", "🙂", "ॐ"]


def random_strings(rng, count: int, longest: int = 30) -> list[str]:
    """`count` distinct random strings of 1..longest characters of ALPHABET."""
    out: set[str] = set()
    while len(out) < count:
        n = int(rng.integers(1, longest + 1))
        out.add("".join(ALPHABET[k] for k in rng.integers(0, len(ALPHABET), n)))
    return sorted(out, key=lambda _: rng.random())


def prefix_family() -> list[str]:
    """Strings that are prefixes of each other, across the 8- and 16-byte boundaries."""
    word = "abcdefghijklmnopqrstu"
    return [word[:k] for k in range(1, len(word) + 1)] + ["李" * k for k in range(1, 7)]


def reference(ids: list, queries: list) -> np.ndarray:
    index = {v: i for i, v in enumerate(ids)}
    return np.array([index.get(q, -1) for q in queries], np.int64)


def queries_of(rng, ids: list, unknown: list, count: int) -> list:
    """`count` queries: ids (with repeats) and unknown ones, shuffled."""
    picks = [ids[k] for k in rng.integers(0, len(ids), count)]
    picks += [unknown[k] for k in rng.integers(0, len(unknown), count // 4)]
    return [picks[k] for k in rng.permutation(len(picks))]


def test_int_ids_find_as_a_dict_does():
    rng = np.random.default_rng(0)
    ids = rng.choice(np.arange(-10**12, 10**12, 9973), 5000, replace=False).tolist()
    unknown = [v + 1 for v in ids[:300]]            # never a multiple of 9973 off an id
    queries = queries_of(rng, ids, unknown, 20000)
    found = IdMap(np.array(ids, np.int64)).find(np.array(queries))
    assert found.dtype == np.int64
    np.testing.assert_array_equal(found, reference(ids, queries))


@pytest.mark.parametrize("form", ["bytes", "str", "list", "wide bytes"])
def test_string_ids_find_as_a_dict_does_in_any_form(form):
    rng = np.random.default_rng(1)
    ids = list(dict.fromkeys(random_strings(rng, 4000) + prefix_family()))
    ids = [ids[k] for k in rng.permutation(len(ids))]
    unknown = random_strings(rng, 500) + ["abcdefghijklmnopqrstuv", "李" * 7, "ab ", "é" * 30]
    unknown = [u for u in unknown if u not in set(ids)]
    queries = queries_of(rng, ids, unknown, 20000)
    stored = np.char.encode(np.array(ids), "utf-8")
    id_map = IdMap(stored)
    assert not id_map._exact                        # the hash path, not the fallback
    given = {"bytes": np.char.encode(np.array(queries), "utf-8"),
             "str": np.array(queries), "list": queries,
             # wider than the stored ids: trailing NULs are no part of a value
             "wide bytes": np.char.encode(np.array(queries), "utf-8").astype("S200")}[form]
    np.testing.assert_array_equal(id_map.find(given), reference(ids, queries))


def test_hash_is_the_same_at_any_width_and_block():
    values = np.char.encode(np.array(prefix_family() + ["Zoë", "a\x00b", "b"]), "utf-8")
    hashes = hash_bytes(values)
    for width in (values.dtype.itemsize + 1, 64, 65):
        np.testing.assert_array_equal(hash_bytes(values.astype(f"S{width}")), hashes)
    np.testing.assert_array_equal(hash_bytes(values[:4]), hashes[:4])   # narrower batch
    assert len(set(hashes.tolist())) == len(values)    # the prefixes all hash apart


def test_hash_in_blocks_equals_hash_at_once(monkeypatch):
    values = np.char.encode(np.array(random_strings(np.random.default_rng(2), 100)), "utf-8")
    whole = hash_bytes(values)
    monkeypatch.setattr(ids_module, "_BLOCK", 7)
    np.testing.assert_array_equal(hash_bytes(values), whole)


def test_colliding_ids_fall_back_to_the_bytes(monkeypatch):
    """A hash of the length alone: every id of a length collides, so IdMap searches
    the bytes themselves, and still answers as the dict does."""
    monkeypatch.setattr(ids_module, "hash_bytes",
                        lambda v: np.char.str_len(np.asarray(v)).astype(np.uint64))
    rng = np.random.default_rng(3)
    ids = list(dict.fromkeys(random_strings(rng, 2000, longest=6) + prefix_family()))
    unknown = [u for u in random_strings(rng, 300, longest=6) if u not in set(ids)]
    queries = queries_of(rng, ids, unknown, 8000)
    id_map = IdMap(np.char.encode(np.array(ids), "utf-8"))
    assert id_map._exact
    np.testing.assert_array_equal(id_map.find(np.array(queries)), reference(ids, queries))


def test_a_nul_word_inside_an_id_collides_and_is_still_found():
    """A word of NULs inside a value is skipped as padding is: two ids that differ by
    one collide for real, and the exact fallback tells them apart."""
    ids = ["abcdefgh" + "\x00" * 8 + "z", "abcdefghz", "other"]
    stored = np.char.encode(np.array(ids), "utf-8")
    assert hash_bytes(stored[:1])[0] == hash_bytes(stored[1:2])[0]
    id_map = IdMap(stored)
    assert id_map._exact
    queries = ids[::-1] + ["abcdefgh", "abcdefgh" + "\x00" * 7 + "z"]
    np.testing.assert_array_equal(id_map.find(np.array(queries)), reference(ids, queries))


def test_an_unknown_id_that_shares_a_hash_is_not_found(monkeypatch):
    """Without collisions among the ids, a query whose hash is an id's is still
    compared byte for byte."""
    monkeypatch.setattr(ids_module, "hash_bytes",
                        lambda v: np.char.str_len(np.asarray(v)).astype(np.uint64))
    id_map = IdMap(np.array([b"a", b"bb", b"ccc"]))
    assert not id_map._exact
    np.testing.assert_array_equal(id_map.find(["bb", "xx", "ccc", "a", "z", "dddd"]),
                                  [1, -1, 2, 0, -1, -1])


def test_unknown_ids_are_named():
    strings = IdMap(np.char.encode(np.array(["Zoë", "李", "x"]), "utf-8"))
    with pytest.raises(GraphError, match=r"edges: id 'Ångström' \(row 1\) is not a node of "
                                         r"the type \(2 unknown id\(s\)\)"):
        strings.positions(["李", "Ångström", "x", "y"], "edges")
    np.testing.assert_array_equal(strings.positions(["x", "Zoë"], "edges"), [2, 0])
    integers = IdMap(np.array([10, -5, 7]))
    with pytest.raises(GraphError, match=r"seeds: id 8 \(row 2\) .*\(1 unknown id\(s\)\)"):
        integers.positions([7, 10, 8], "seeds")


def test_empty_map_and_empty_queries():
    np.testing.assert_array_equal(IdMap(np.zeros(0, np.int64)).find([3, 4]), [-1, -1])
    np.testing.assert_array_equal(IdMap(np.zeros(0, "S1")).find(["a"]), [-1])
    assert IdMap(np.array([b"a"])).find(np.zeros(0, "S1")).shape == (0,)
    assert IdMap(np.array([1, 2])).find(np.zeros(0, np.int64)).shape == (0,)
