"""Damaged document offsets in a token shard: refused with a ShardError that names the shard and says what to do.

Opening a token shard does not walk its offsets (Arrow's full validation of ~10M
offsets per shard was most of the first batch at 10^8 documents): their ends are
checked when the shard is mapped, and the rest in the native pass that plans the
shard's sequences (``pack="documents"``) or before ``which`` reads documents. Each
case patches the offsets of an intact shard in place (same size) and opens it with
``verify=False``, so only these checks stand between the damage and the batches (a
hostile file whose checksum was written to match).
"""

from __future__ import annotations

import numpy as np
import pytest

import chute
from chute.format import validate

LENGTHS = [3, 5, 7, 2, 6]  # distinct prefix sums: the offsets' bytes occur once in the shard


def damaged(tmp_path, offsets: list[int]):
    """A one-shard token dataset whose document offsets read ``offsets`` on disk (written intact first)."""
    rng = np.random.default_rng(0)
    docs = [rng.integers(1, 60_000, n).astype(np.uint16) for n in LENGTHS]
    path = tmp_path / "ds"
    chute.tokens.write(docs, path, vocab_size=65_536)
    shard = chute.open(path).shard_path(0)
    intact = np.zeros(len(LENGTHS) + 1, np.int64)
    np.cumsum(LENGTHS, out=intact[1:])
    data = bytearray(open(shard, "rb").read())
    at = bytes(data).find(intact.tobytes())
    assert at >= 0 and bytes(data).find(intact.tobytes(), at + 1) < 0
    data[at : at + intact.nbytes] = np.asarray(offsets, np.int64).tobytes()
    with open(shard, "wb") as f:
        f.write(data)
    return path, np.concatenate(docs).astype(np.int64)


def first_batch(path, pack: str, seq_len: int = 16):
    view = chute.tokens.sequences(chute.open(path, verify=False), seq_len, pack=pack)
    return view.get_batch(np.arange(len(view)))


@pytest.mark.parametrize("seq_len", [16, 10])  # 16: counted by the writer (the plan checks); 10: counted at opening
def test_decreasing_offsets_are_refused_by_the_packing_pass(tmp_path, seq_len):
    path, _ = damaged(tmp_path, [0, 3, 8, 6, 17, 23])
    with pytest.raises(chute.ShardError, match=r"shard-00000\..*\.arrow has damaged document offsets \(document offsets "
                       r"decrease at document 2.*run `chute inspect --verify`"):
        first_batch(path, "documents", seq_len)


def test_an_offset_past_the_buffer_inside_the_shard_is_refused(tmp_path):
    path, _ = damaged(tmp_path, [0, 3, 9_999, 15, 17, 23])  # a document would end far outside the tokens
    with pytest.raises(chute.ShardError, match=r"shard-00000\..*has damaged document offsets.*decrease at document 2"):
        first_batch(path, "documents")


@pytest.mark.parametrize("pack", ["concat", "documents"])
def test_a_last_offset_past_the_buffer_is_refused(tmp_path, pack):
    path, _ = damaged(tmp_path, [0, 3, 8, 15, 17, 40])  # 40 tokens claimed, 23 stored
    with pytest.raises(chute.ShardError, match=r"shard-00000\..*(larger than values array|holds 40 tokens).*write"):
        first_batch(path, pack)


@pytest.mark.parametrize("pack", ["concat", "documents"])
def test_offsets_that_do_not_start_at_zero_are_refused(tmp_path, pack):
    path, _ = damaged(tmp_path, [2, 3, 8, 15, 17, 23])
    with pytest.raises(chute.ShardError, match=r"shard-00000\..*is damaged: its document offsets start at 2, not 0; "
                       r"run `chute inspect --verify`"):
        first_batch(path, pack)


def test_concat_reads_no_offsets_between_the_ends_but_which_checks_them(tmp_path):
    path, stream = damaged(tmp_path, [0, 3, 8, 6, 17, 23])
    batch = first_batch(path, "concat", 4)  # the tokens are intact and concat windows never look at documents
    for i, row in enumerate(batch["input_ids"].tolist()):
        assert row == stream[4 * i : 4 * i + 4].tolist()
    with pytest.raises(chute.ShardError, match=r"shard-00000\..*has damaged document offsets.*decrease at document 2"):
        chute.tokens.which(chute.open(path, verify=False), 0, 2, seq_len=4, shuffle=False)


def test_the_dataset_itself_still_refuses_the_damage(tmp_path):
    path, _ = damaged(tmp_path, [0, 3, 8, 6, 17, 23])
    ds = chute.open(path, verify=False)
    chute.tokens.sequences(ds, 16, pack="concat").get_batch([0])  # maps the shard with the token source's checks
    with pytest.raises(chute.ShardError, match=r"shard-00000\..*row 2.*is corrupt"):
        ds.get_batch([2])  # a direct read: the kernel checks the offsets of each row it reads
    with pytest.raises(chute.ShardError, match=r"failed verification: shard shard-00000\..*checksum"):
        ds.verify()  # `chute inspect --verify`: checksums and Arrow's full validation, as before
    problem = validate.check_file(ds.shard_path(0), ds.shards[0], ds.schema, ds.manifest.arrow_schema, "here")
    assert problem is not None and "column 'tokens' is not valid Arrow data" in problem


def test_defer_offset_checks_takes_only_variable_size_columns_of_the_dataset(tmp_path):
    ds = chute.write([{"x": np.float32(1), "s": "a"}], tmp_path / "plain")
    with pytest.raises(ValueError, match=r"defer_offset_checks takes variable-size columns of .*plain, got \['nope', 'x'\]"):
        ds.defer_offset_checks(["nope", "x"])
    ds.defer_offset_checks(["s"])
    assert ds[0]["s"] == "a"
