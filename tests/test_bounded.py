"""The bounded read every layer uses (chute/_bounded.py): never more than one byte past the limit is read."""

from __future__ import annotations

import io

import pytest

from chute._bounded import read_within
from chute.errors import ManifestError
from chute.format.manifest import read_manifest


class Counted(io.BytesIO):
    """A file that records how much each read asked for."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.asked: list[int] = []

    def read(self, n: int | None = -1) -> bytes:
        self.asked.append(-1 if n is None else n)
        return super().read(n)


@pytest.mark.parametrize("size", [0, 1, 9, 10])
def test_a_source_within_the_limit_is_handed_on_whole_in_blocks(size):
    data = bytes(range(size))
    f, parts = Counted(data), []
    assert read_within(f.read, 10, parts.append, block=4) == size
    assert b"".join(parts) == data and all(0 < len(p) <= 4 for p in parts)
    assert max(f.asked) <= 4  # in blocks


@pytest.mark.parametrize("size", [11, 12, 1000])
def test_a_source_past_the_limit_stops_one_byte_past_it(size):
    f, parts = Counted(bytes(size)), []
    assert read_within(f.read, 10, parts.append, block=4) == 11
    assert f.tell() == 11 and sum(len(p) for p in parts) <= 10  # the block that crossed it is not handed on


def test_a_local_manifest_at_the_limit_is_read_and_one_byte_more_is_refused(tmp_path):
    path = tmp_path / "manifest.json"
    path.write_bytes(b'{"a": 1}' + b" " * 92)  # 100 bytes
    assert read_manifest(str(path), 100).strip() == '{"a": 1}'
    assert read_manifest(str(path)).strip() == '{"a": 1}'
    with pytest.raises(ManifestError, match=r"manifest.json is larger than 99 bytes, the most chute reads of a manifest"):
        read_manifest(str(path), 99)


def test_an_object_read_through_a_file_system_chute_does_not_stream_is_bounded_the_same():
    import fsspec

    from chute.storage.net.remote import Remote, TooLarge

    fsspec.filesystem("memory").pipe("/bounded/ds/manifest.json", bytes(range(100)))
    remote = Remote("memory://bounded/ds")
    try:
        assert remote.read("manifest.json", 100) == bytes(range(100))
        with pytest.raises(TooLarge, match=r"GET memory://bounded/ds/manifest.json: the object is larger than 99 bytes"):
            remote.read("manifest.json", 99)
        got: list[bytes] = []
        remote.download_stream("manifest.json", got.append, got.clear, size=100)
        assert b"".join(got) == bytes(range(100))
    finally:
        remote.close()
        fsspec.filesystem("memory").rm("/bounded", recursive=True)
