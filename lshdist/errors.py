"""Errors raised for bad input.  The CLI maps every one of them to exit code 2, no traceback."""


class LshdistError(Exception):
    """Base of every error lshdist raises on purpose."""


class InputError(LshdistError, ValueError):
    """The input data, options or files are not what the job expects."""


class FormatError(InputError):
    """A file or directory is not in the format it claims, or is corrupted."""


class OutputExistsError(InputError, FileExistsError):
    """The output exists and ``overwrite`` was not asked for."""


class NotFittedError(LshdistError, RuntimeError):
    """An estimator was used before ``fit``."""


class ClusterError(LshdistError, RuntimeError):
    """The Dask cluster could not be reached or started."""
