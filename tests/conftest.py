import os

import pytest

from lshdist.datasets import data_dir
from lshdist.errors import InputError


@pytest.fixture(scope="session")
def data_root():
    """The real datasets folder (`lshdist.datasets.data_dir`).

    Without it the tests that need it skip — except under CI (``LSHDIST_REQUIRE_DATA=1``,
    set by ``.ci/run``), where a missing dataset fails the run instead of greening it.
    """
    try:
        return data_dir()
    except InputError as exc:
        if os.environ.get("LSHDIST_REQUIRE_DATA") == "1":
            pytest.fail(f"real datasets required (LSHDIST_REQUIRE_DATA=1) but not available: "
                        f"{exc}")
        pytest.skip(f"real datasets not available: {exc}")


@pytest.fixture(scope="session")
def letter(data_root):
    from lshdist.datasets import load_letter

    return load_letter(data_root)


@pytest.fixture(scope="session")
def fashion(data_root):
    from lshdist.datasets import load_fashion_mnist

    return load_fashion_mnist(data_root)


@pytest.fixture(scope="session")
def newsgroups(data_root):
    from lshdist.datasets import load_newsgroups

    return load_newsgroups(root=data_root)
