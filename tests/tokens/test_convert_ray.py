"""chute convert --tokenizer --ray: Ray actors tokenize, the dataset is the same bytes as with worker processes."""

from __future__ import annotations

import os

import pytest

from chute.errors import ChuteError
from chute.tokens.text import convert
from tests.tokens.text_corpus import TEXTS, train_tokenizer, write_jsonl

pytest.importorskip("tokenizers")


@pytest.fixture(scope="module")
def local_ray():
    """A local Ray of 2 CPUs: the one tests/ray started if it is still up, else one for this module."""
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        yield ray
        return
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR", configure_logging=False)
    yield ray
    ray.shutdown()


def _shard_bytes(ds) -> list[bytes]:
    return [open(os.path.join(ds.root, s.file), "rb").read() for s in ds.shards]


def test_ray_actors_write_what_worker_processes_write(local_ray, tmp_path):
    tokenizer = train_tokenizer(str(tmp_path / "tokenizer.json"))
    texts = [f"{i} " + TEXTS[i % len(TEXTS)] for i in range(400)]
    src = write_jsonl(str(tmp_path / "corpus.jsonl"), texts)
    options = dict(tokenizer=tokenizer, eos=True, progress=False, chunk_bytes=500, shard_size="4KB")
    here = convert(src, tmp_path / "here", workers=0, **options)
    on_ray = convert(src, tmp_path / "ray", ray="local", workers=2, **options)
    assert len(here.shards) > 2
    assert _shard_bytes(on_ray) == _shard_bytes(here)


def test_an_error_in_an_actor_is_the_chute_error_and_leaves_nothing(local_ray, tmp_path):
    tokenizer = train_tokenizer(str(tmp_path / "tokenizer.json"))
    src = str(tmp_path / "corpus.jsonl")
    with open(src, "w") as f:
        f.write('{"text": "the dog"}\n' * 50 + '{"body": "no text"}\n')
    with pytest.raises(ChuteError, match=r"corpus.jsonl line 51: no 'text' key \(its keys: 'body'\)"):
        convert(src, tmp_path / "out", tokenizer=tokenizer, ray="local", workers=1, progress=False, chunk_bytes=100)
    assert not (tmp_path / "out").exists()
