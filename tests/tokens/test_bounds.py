"""What comes from outside is bounded: token ids past the dtype, truncated Megatron files, out-of-range arguments and a
damaged token manifest are each refused with a chute error that names the document, the files, the argument or the
field, before anything is written or allocated (issue 32)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import chute
from tests.tokens.test_files import write_megatron


@pytest.mark.parametrize(
    "docs, message",
    [
        ([[2**40]], r"document 0 holds token id 1099511627776; token ids must be below 2\*\*32"),
        ([[1, 2], [2**32 + 7, 5]], r"document 1 holds token id 4294967303; token ids must be below 2\*\*32"),
        ([np.array([5, 2**63 + 5], dtype=np.uint64)], "document 0 holds token id 9223372036854775813"),
        ([[3], np.array([2**70, 1], dtype=object)], "document 1 holds token id 1180591620717411303424"),
        ([[3], [4, -2**70]], "document 1 holds token id -1180591620717411303424; token ids cannot be negative"),
        ([[3], np.array([4, "x"], dtype=object)], "document 1 holds a str value; token ids must be integers"),
    ],
)
def test_ids_past_uint32_are_refused_before_anything_is_written(tmp_path, docs, message):
    with pytest.raises(chute.SchemaError, match=message):
        chute.tokens.write(docs, tmp_path / "bad")
    assert not (tmp_path / "bad").exists()


def test_object_arrays_of_small_ints_are_token_ids(tmp_path):
    ds = chute.tokens.write([np.array([1, 70_000], dtype=object), np.array([], dtype=object)], tmp_path / "ok")
    assert ds.metadata["tokens"]["dtype"] == "uint32" and ds[0]["tokens"].tolist() == [1, 70_000]


@pytest.mark.parametrize("vocab_size", [None, 1000])
def test_extend_checks_every_id_before_writing(tmp_path, vocab_size):
    with pytest.raises(chute.SchemaError, match=r"document 3 holds token id 4294967296"):
        with chute.tokens.TokenWriter(tmp_path / "bad", vocab_size=vocab_size) as w:
            w.append([1])
            w.extend(np.array([1, 2, 3, 2**32], dtype=np.uint64), [1, 2, 1])
    assert not (tmp_path / "bad").exists()
    with pytest.raises(chute.SchemaError, match="lengths must be integers >= 0"):
        with chute.tokens.TokenWriter(tmp_path / "bad", vocab_size=vocab_size) as w:
            w.extend(np.array([1, 2]), np.array([1.0, 1.0]))


@pytest.mark.parametrize("value, error", [(2**32 + 1, ValueError), (1.5, TypeError), (True, TypeError), (0, ValueError)])
def test_vocab_size_is_an_integer_in_range(tmp_path, value, error):
    with pytest.raises(error, match="vocab_size must be an integer"):
        chute.tokens.write([[1]], tmp_path / "bad", vocab_size=value)


def test_a_tokenizer_function_giving_ids_past_uint32_names_the_line(tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in ["a b", "", "big", "c"]))
    for value in (2**32, 2**70, -(2**70)):
        with pytest.raises(chute.ChuteError, match=rf"c\.jsonl line 3: the tokenizer function .* gave token id {value}; ids must be"):
            chute.tokens.convert(corpus, tmp_path / "out", tokenizer=_Big(value), workers=0, progress=False)
        assert not (tmp_path / "out").exists()


class _Big:
    """A tokenizer function that gives ``value`` for the text 'big' (a callable object: its results are not checked
    by the tokenizer's own types)."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __call__(self, text: str) -> list[int]:
        return [self.value] if text == "big" else [len(w) for w in text.split()]


# ---------------------------------------------------------------- Megatron files whose .bin and .idx disagree


@pytest.mark.parametrize("change", ["short", "empty", "long"])
@pytest.mark.parametrize("pack", ["concat", "documents"])
def test_a_bin_of_another_size_than_its_idx_says_is_refused_at_open(tmp_path, change, pack):
    prefix = tmp_path / "part_text_document"
    write_megatron(prefix, [[1, 2, 3], [4, 5], [6, 7, 8, 9]] * 30)
    data = (tmp_path / "part_text_document.bin").read_bytes()
    data = {"short": data[:-2], "empty": b"", "long": data + b"\0\0"}[change]
    (tmp_path / "part_text_document.bin").write_bytes(data)
    with pytest.raises(chute.ShardError, match=rf"part_text_document\.bin holds {len(data)} bytes but .*part_text_document"
                       r"\.idx describes 540 \(90 sequences of uint16 tokens\): the \.bin is truncated"):
        chute.tokens.sequences(chute.tokens.megatron(prefix), 4, pack=pack)


def test_an_intact_megatron_pair_and_an_empty_one_open(tmp_path):
    write_megatron(tmp_path / "empty", [])
    assert len(chute.tokens.sequences(chute.tokens.megatron(tmp_path / "empty"), 4)) == 0
    write_megatron(tmp_path / "one", [[1, 2, 3, 4, 5, 6]])
    assert len(chute.tokens.sequences(chute.tokens.megatron(tmp_path / "one"), 4)) == 1


# ---------------------------------------------------------------- arguments


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    return chute.tokens.write([list(range(1, 30))] * 4, tmp_path_factory.mktemp("b") / "ds", vocab_size=100)


@pytest.mark.parametrize("pack", ["concat", "documents"])
@pytest.mark.parametrize(
    "seq_len, error, message",
    [
        (2**31, ValueError, r"seq_len must be an integer from 1 to 2\*\*31-1, got 2147483648"),
        (2**63, ValueError, r"seq_len must be an integer from 1 to 2\*\*31-1, got 9223372036854775808"),
        (0, ValueError, "seq_len must be an integer from 1"),
        (1.5, TypeError, "seq_len must be an integer, got float 1.5"),
        (True, TypeError, "seq_len must be an integer, got bool True"),
        ("8", TypeError, "seq_len must be an integer, got str '8'"),
    ],
)
def test_seq_len_is_an_integer_in_range(small, pack, seq_len, error, message):
    with pytest.raises(error, match=message):
        chute.tokens.sequences(small, seq_len, pack=pack)
    with pytest.raises(error, match=message):
        chute.tokens.which(small, 0, 1, seq_len=seq_len, pack=pack)


def test_the_longest_seq_len_is_served(small):
    view = chute.tokens.sequences(small, 2**31 - 1, pack="documents")  # no damaged offsets blamed: 4 documents, 1 sequence
    assert len(view) == 1


@pytest.mark.parametrize("pad_id, error", [(2**63, ValueError), (0.5, TypeError), (False, TypeError)])
def test_pad_id_is_an_integer_in_range(small, pad_id, error):
    with pytest.raises(error, match="pad_id must be an integer"):
        chute.tokens.sequences(small, 8, pack="documents", pad_id=pad_id)


# ---------------------------------------------------------------- a damaged token manifest


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("dtype", "float32", r"tokens\.dtype is 'float32', not 'uint16' or 'uint32'"),
        ("dtype", "uint32", r"tokens\.dtype is 'uint32' but the column 'tokens' holds uint16"),
        ("shard_tokens", [10**18], r"tokens\.shard_tokens\[0\] is 1000000000000000000, not an integer from 0 to \d+"),
        ("shard_tokens", [-1], r"tokens\.shard_tokens\[0\] is -1"),
        ("shard_tokens", "x", r"tokens\.shard_tokens is 'str', not a list of one token count per shard \(1\)"),
        ("shard_tokens", [1, 2], r"tokens\.shard_tokens is a list of 2, not a list"),
        ("packed", {"16": [10**15]}, r"tokens\.packed\[16\]\[0\] is 1000000000000000, not an integer from 0 to 116"),
        ("packed", {"16": [1.5]}, r"tokens\.packed\[16\]\[0\] is 1\.5"),
        ("packed", {"x": [1]}, r"tokens\.packed has the key 'x', not a sequence length"),
        ("packed", [1], r"tokens\.packed is a list, not a mapping"),
        ("eos_id", 2**40, r"tokens\.eos_id is 1099511627776, not an integer from 0 to 99"),
        ("vocab_size", True, r"tokens\.vocab_size is True"),
    ],
)
def test_damaged_token_metadata_is_a_manifest_error_naming_the_field(small, tmp_path, field, value, message):
    import shutil

    root = tmp_path / "ds"
    shutil.copytree(small.root, root)
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["metadata"]["tokens"][field] = value
    (root / "manifest.json").write_text(json.dumps(manifest))
    for pack in ("concat", "documents"):
        with pytest.raises(chute.ManifestError, match=message + r".*the manifest is damaged"):
            chute.tokens.sequences(root, 16, pack=pack)
