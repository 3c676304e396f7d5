"""Errors the CLI maps to exit codes."""


class UsageError(Exception):
    """Bad input from the user (config, argument, run directory): exit code 2, no traceback."""

    exit_code = 2


class ConfigError(UsageError):
    """A problem in the run configuration."""


class DivergenceError(RuntimeError):
    """Replicas of the algorithm state differ between ranks: the run can no longer be trusted."""

    exit_code = 3
