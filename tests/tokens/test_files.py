"""Megatron-LM indexed datasets and flat numpy token files, read in place by chute.tokens.sequences."""

from __future__ import annotations

import pickle
import struct

import numpy as np
import pytest

import chute
from tests.tokens.reference import concat_window, num_windows, pack_documents, packed_batch


def write_megatron(prefix, docs, dtype=np.uint16):
    """The MMIDIDX layout as Megatron-LM documents it: header, version, dtype code, counts, sizes, pointers, doc indices."""
    code = {np.uint16: 8, np.int32: 4}[dtype]
    itemsize = np.dtype(dtype).itemsize
    sizes = np.asarray([len(d) for d in docs], dtype=np.int32)
    pointers = np.zeros(len(docs), dtype=np.int64)
    np.cumsum(sizes[:-1].astype(np.int64) * itemsize, out=pointers[1:])
    with open(f"{prefix}.bin", "wb") as f:
        for doc in docs:
            f.write(np.asarray(doc, dtype=dtype).tobytes())
    with open(f"{prefix}.idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00")
        f.write(struct.pack("<Q", 1))
        f.write(struct.pack("<B", code))
        f.write(struct.pack("<Q", len(docs)))
        f.write(struct.pack("<Q", len(docs) + 1))
        f.write(sizes.tobytes())
        f.write(pointers.tobytes())
        f.write(np.arange(len(docs) + 1, dtype=np.int64).tobytes())


def docs_of(n, seed, vocab=60_000):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, int(rng.integers(1, 40))).tolist() for _ in range(n)]


@pytest.mark.parametrize("dtype", [np.uint16, np.int32])
def test_megatron_sequences_equal_what_the_files_hold(tmp_path, dtype):
    parts = [docs_of(60, 1), docs_of(45, 2)]
    for k, docs in enumerate(parts):
        write_megatron(tmp_path / f"part{k}_text_document", docs, dtype)
    source = chute.tokens.megatron([tmp_path / "part0_text_document", tmp_path / "part1_text_document"])
    stream = [t for docs in parts for d in docs for t in d]
    concat = chute.tokens.sequences(source, 32)
    assert len(concat) == num_windows(len(stream), 32) and len(concat.shards) == 2
    batch = concat.get_batch(np.arange(len(concat)))
    for i in range(len(concat)):
        assert [batch["input_ids"][i].tolist(), batch["labels"][i].tolist()] == list(concat_window(stream, i, 32))
    packed = chute.tokens.sequences(source, 32, pack="documents")
    expected = pack_documents(parts[0], 32) + pack_documents(parts[1], 32)
    got = packed.get_batch(np.arange(len(packed)))
    want = packed_batch(expected, 32, 0)
    assert {k: got[k].tolist() for k in want} == want
    again = pickle.loads(pickle.dumps(packed))  # what a worker process receives: the paths, mapped there
    assert again.get_batch([3])["input_ids"].tolist() == got["input_ids"][3:4].tolist()


def test_megatron_is_read_in_place(tmp_path):
    write_megatron(tmp_path / "corpus", docs_of(20, 3))
    view = chute.tokens.sequences(chute.tokens.megatron(tmp_path / "corpus"), 8)
    before = view[0]["input_ids"].tolist()
    on_disk = np.memmap(tmp_path / "corpus.bin", dtype=np.uint16, mode="r+")
    on_disk[0] = 12_345  # a change to the file shows through the mapping: the view reads the file, not a copy
    on_disk.flush()
    assert view[0]["input_ids"].tolist() == [12_345, *before[1:]]
    tokens, _, _ = view.source.map(0, False)
    assert isinstance(tokens, np.memmap) and tokens.filename == str(tmp_path / "corpus.bin")


def test_flat_npy_with_eos_boundaries(tmp_path):
    docs = [d + [7] for d in docs_of(50, 4, vocab=1000)]
    stream = np.asarray([t for d in docs for t in d], dtype=np.uint16)
    np.save(tmp_path / "tokens.npy", stream)
    source = chute.tokens.flat(tmp_path / "tokens.npy", eos_id=7)
    concat = chute.tokens.sequences(source, 16)
    assert concat.get_batch([2])["input_ids"].tolist() == [stream[32:48].tolist()]
    packed = chute.tokens.sequences(source, 16, pack="documents")
    # eos_id 7 also appears inside documents (random ids): the boundaries are wherever 7 is
    cuts = [0, *(np.flatnonzero(stream == 7) + 1).tolist()]
    documents = [stream[a:b].tolist() for a, b in zip(cuts, cuts[1:])]
    want = packed_batch(pack_documents(documents, 16), 16, 0)
    got = packed.get_batch(np.arange(len(packed)))
    assert {k: got[k].tolist() for k in want} == want


def test_flat_raw_file_needs_its_dtype(tmp_path):
    stream = np.arange(100, dtype=np.int32) * 1000
    stream.tofile(tmp_path / "tokens.bin")
    with pytest.raises(chute.ChuteError, match="raw token file: pass dtype="):
        chute.tokens.flat(tmp_path / "tokens.bin")
    view = chute.tokens.sequences(chute.tokens.flat(tmp_path / "tokens.bin", dtype="int32"), 10)
    assert len(view) == 9 and view[8]["labels"].tolist() == (stream[81:91]).tolist()


def test_damaged_megatron_index_is_named(tmp_path):
    write_megatron(tmp_path / "c", docs_of(5, 5))
    data = bytearray((tmp_path / "c.idx").read_bytes())
    data[:7] = b"NOTANID"
    (tmp_path / "c.idx").write_bytes(bytes(data))
    with pytest.raises(chute.ShardError, match="c.idx is not a Megatron-LM index"):
        chute.tokens.megatron(tmp_path / "c")


def test_a_document_of_megatron_and_flat_files_by_index(tmp_path):
    parts = [docs_of(7, 3), docs_of(5, 4)]
    for k, docs in enumerate(parts):
        write_megatron(tmp_path / f"p{k}", docs)
    source = chute.tokens.megatron([tmp_path / "p0", tmp_path / "p1"])
    every = [d for docs in parts for d in docs]
    assert len(source) == 12 and [source[i].tolist() for i in range(12)] == every
    assert source[-1].tolist() == every[-1] and source[np.int64(7)].tolist() == every[7]
    with pytest.raises(IndexError, match="document 12 is out of range for .*p0 .* of 12 documents"):
        source[12]
    with pytest.raises(TypeError, match="document indices must be integers, not float"):
        source[1.0]
    np.save(tmp_path / "flat.npy", np.array([1, 2, 0, 3, 0, 4], dtype=np.uint16))
    flat = chute.tokens.flat(tmp_path / "flat.npy", eos_id=0)
    assert len(flat) == 3 and [flat[i].tolist() for i in range(3)] == [[1, 2, 0], [3, 0], [4]]


def test_views_of_different_seq_len_do_not_mix_and_the_error_names_the_fix(tmp_path):
    write_megatron(tmp_path / "m", docs_of(40, 5))
    source = chute.tokens.megatron(tmp_path / "m")
    with pytest.raises(chute.SchemaError, match=r"one seq_len and packing \('a' seq_len=16 pack='concat', 'b' seq_len=32 "
                       r"pack='concat'\): make each view with the same ones, e.g. chute.tokens.sequences\(data, 32"):
        chute.mix({"a": chute.tokens.sequences(source, 16), "b": chute.tokens.sequences(source, 32)}, weights={"a": 1, "b": 1})
