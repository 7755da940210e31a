"""The format registry: ``--format`` choices, detection and dispatch come from one table."""

import argparse

import pytest

from lshdist.errors import FormatError, InputError, LshdistError
from lshdist.inputs import FORMATS, REGISTRY, detect_format, read_input, read_inputs
from lshdist.inputs.files import Probe
from lshdist.inputs.registry import formats_accepting, get_format
from lshdist.jobs import ingest


def _ingest_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    return ingest.add_parser(parser.add_subparsers())


def _option(parser: argparse.ArgumentParser, flag: str) -> argparse.Action:
    return next(a for a in parser._actions if flag in a.option_strings)


def test_format_choices_detection_and_registry_agree(samples):
    parser = _ingest_parser()
    assert tuple(REGISTRY) == FORMATS
    assert tuple(_option(parser, "--format").choices) == FORMATS
    assert set(samples) == set(FORMATS)  # a new format needs a sample here
    for name, path in samples.items():
        assert detect_format(path) == name
        assert REGISTRY[name].sniff(Probe.of(path))
        assert read_input(path).format == name  # dispatch goes to the reader of that name
        assert read_input(path, format=name).format == name
        assert f"{name}: {REGISTRY[name].title}" in parser.description


def test_detection_takes_the_first_accepting_format(samples):
    # csv accepts any delimited text: the formats recognised by their first line come first
    order = list(REGISTRY)
    for name in ("letter", "newsgroups"):
        probe = Probe.of(samples[name])
        accepting = [f for f in order if REGISTRY[f].sniff(probe)]
        assert accepting == [name, "csv"]
    for name in ("npy", "npz", "parquet", "idx", "csv", "zarr"):
        probe = Probe.of(samples[name])
        assert [f for f in order if REGISTRY[f].sniff(probe)] == [name]


def test_format_options_come_from_the_registry():
    assert formats_accepting("label_column") == ("parquet", "csv")
    assert formats_accepting("id_column") == ("parquet", "csv")
    assert formats_accepting("header") == ("csv",)
    assert formats_accepting("weighting") == ("newsgroups",)
    with pytest.raises(InputError, match="unknown format 'xls'; expected one of: npy, npz, "):
        get_format("xls")


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_reader_given_another_format_raises_an_input_error(samples, fmt):
    """Every reader, fed every other sample: rows, or an InputError (exit 2), no traceback."""
    for name, path in samples.items():
        try:
            read_inputs([path], format=fmt)
        except LshdistError as exc:
            assert isinstance(exc, InputError), (name, exc)
            assert str(path) in str(exc), (name, exc)  # the message names the file


def test_npy_reader_on_a_text_file_says_what_came(samples):
    with pytest.raises(
        FormatError,
        match=r"'.*a.csv' is not a NumPy file \(first bytes 66 31 2c 66 32 2c; expected "
        r"93 4e 55 4d 50 59 for .npy or 50 4b 03 04 for .npz\); pass the right --format",
    ):
        read_inputs([samples["csv"]], format="npy")
    with pytest.raises(FormatError, match=r"could not be read as CSV .*is it really CSV"):
        read_inputs([samples["idx"]], format="csv")
