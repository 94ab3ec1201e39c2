"""User-facing errors.

Everything a user can get wrong (layouts, names, shapes, ranges) raises ``ConfigError``;
the CLI turns it into a one-line message and exit code 2 instead of a traceback.
"""


class ConfigError(ValueError):
    """Invalid user input; the message names the problem and the fix."""


class NonFiniteGradientError(FloatingPointError):
    """A gradient holds NaN or Inf and the policy is to raise."""
