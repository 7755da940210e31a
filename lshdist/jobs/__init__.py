"""Jobs: one module per `lshdist` subcommand (argument and config parsing only).

ARCHITECTURE.md section 5 puts ``jobs/`` beside the package; it lives inside it here so the
installed wheel does not claim a top-level package named ``jobs``.
"""
