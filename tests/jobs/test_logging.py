"""The command line's log levels reach Dask's loggers, however the imports fall."""

import subprocess
import sys

import pytest

PROBE = """
import logging, sys
import lshdist.cli as cli
cli.build_parser()  # imports no dask: configure_logging loads dask's config itself
if sys.argv[2:] == ['early']:
    import dask  # a caller's imports may load dask's config before the levels are set
cli.configure_logging(int(sys.argv[1]))
import distributed  # sets its loggers from dask's config on first import
print(logging.getLogger("distributed").getEffectiveLevel(),
      logging.getLogger("distributed.scheduler").getEffectiveLevel())
"""


@pytest.mark.parametrize("when", ["late", "early"])
@pytest.mark.parametrize(("verbose", "level"), [(0, 30), (1, 20), (2, 10)])
def test_dask_loggers_follow_the_verbosity(verbose, level, when):
    """Without -v Dask logs warnings only (-v: INFO, -vv: DEBUG), whether dask's config was
    loaded before `configure_logging` runs (``early``) or not (``late``; the parser imports no
    dask): distributed, imported later, sets its loggers from that config, and at INFO every
    Dask job printed dozens of scheduler lines and, at shutdown, a closed stream's traceback.
    A fresh interpreter: distributed must not be imported yet."""
    env_free = {k: v for k, v in __import__("os").environ.items()
                if not k.startswith("DASK_LOGGING")}
    out = subprocess.run([sys.executable, "-c", PROBE, str(verbose), when], capture_output=True,
                         text=True, env=env_free, check=True).stdout.split()
    assert out == [str(level), str(level)]


def test_a_users_dask_logging_setting_stands():
    import os

    env = {**os.environ, "DASK_LOGGING__DISTRIBUTED": "error"}
    out = subprocess.run([sys.executable, "-c", PROBE, "0"], capture_output=True, text=True,
                         env=env, check=True).stdout.split()
    assert out == ["40", "40"]


def test_a_dask_yaml_logging_setting_stands(tmp_path):
    """A ``logging: distributed:`` entry of the user's Dask YAML is not overridden."""
    import os

    (tmp_path / "mine.yaml").write_text("logging:\n  distributed: error\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DASK_LOGGING")}
    env["DASK_CONFIG"] = str(tmp_path)
    out = subprocess.run([sys.executable, "-c", PROBE, "0"], capture_output=True, text=True,
                         env=env, check=True).stdout.split()
    assert out == ["40", "40"]
