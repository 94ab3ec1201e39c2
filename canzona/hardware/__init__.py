"""Hardware profiles (``profile``): the one machine description plan, runtime and analysis read."""

from canzona.hardware.profile import (
    DEFAULT_CPU,
    DEFAULT_GPU,
    Link,
    Profile,
    describe,
    load_profile,
    profile_names,
    with_profile_overrides,
)

__all__ = [
    "DEFAULT_CPU",
    "DEFAULT_GPU",
    "Link",
    "Profile",
    "describe",
    "load_profile",
    "profile_names",
    "with_profile_overrides",
]
