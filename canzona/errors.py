"""User-facing errors.

Everything a user can get wrong (layouts, names, shapes, ranges) raises ``ConfigError``;
the CLI turns it into a one-line message and exit code 2 instead of a traceback.
"""


class ConfigError(ValueError):
    """Invalid user input; the message names the problem and the fix."""


class NonFiniteGradientError(FloatingPointError):
    """A gradient holds NaN or Inf and the policy is to raise."""


class NotSupportedError(ConfigError):
    """A valid request that Canzona does not run yet (context parallelism beyond the layout, issue
    #50); a ``ConfigError``, so the CLI reports it in one line and exits 2, never a run that
    quietly ignores the request. The message names the issue that tracks the work."""
