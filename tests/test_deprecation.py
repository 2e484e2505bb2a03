"""The deprecation path (CHANGELOG.md): an old argument name works for one minor version, with a FutureWarning."""

from __future__ import annotations

import warnings

import pytest

from chute._deprecation import no_more, renamed


def make(workers=None, **deprecated):
    workers = renamed(deprecated, "num_threads", "workers", workers, since="0.2", where="chute.Loader")
    no_more(deprecated, "chute.Loader")
    return workers


def test_the_old_name_still_works_and_says_what_to_use_and_when_it_goes():
    with pytest.warns(FutureWarning, match=r"chute.Loader: num_threads= is deprecated since chute 0.2 and will be removed in chute 0.3; use workers="):
        assert make(num_threads=3) == 3


def test_the_new_name_is_silent():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert make(workers=2) == 2


def test_both_names_or_an_unknown_one_are_type_errors():
    with pytest.raises(TypeError, match="pass only workers="):
        make(workers=2, num_threads=3)
    with pytest.raises(TypeError, match="unexpected keyword argument.*: colour"):
        make(colour=1)
