"""Suite-wide pytest setup."""

from tests import hypothesis_profiles  # noqa: F401 - registers and loads the hypothesis profiles
