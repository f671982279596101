"""Config base class (configs layer: stdlib + pydantic only).

Every section forbids unknown keys; the loader walks the raw dict first so that an unknown key
fails with its dotted path and a suggestion, and a verl key that tandem-rl knows but does not
implement (listed in ``VERL_UNIMPLEMENTED``) is dropped with one warning.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict


class ConfigWarning(UserWarning):
    """A config key is accepted but has no effect in tandem-rl."""


class Section(BaseModel):
    """A config section: frozen, strict about keys, every field documented."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, validate_default=True, use_attribute_docstrings=True
    )

    #: verl keys of this section that load (for config compatibility) but do nothing here.
    VERL_UNIMPLEMENTED: ClassVar[frozenset[str]] = frozenset()
    #: True for a verl section of which tandem-rl implements only its fields: every other key (verl's sections
    #: differ between versions) loads with the same warning instead of failing as unknown.
    VERL_OTHER_KEYS_UNIMPLEMENTED: ClassVar[bool] = False
    #: field -> why it has no effect in tandem-rl: a value other than the default loads with a warning saying so.
    NO_EFFECT: ClassVar[dict[str, str]] = {}
    #: field -> what to do instead: a value other than the default is rejected with that explanation.
    ONLY_DEFAULT: ClassVar[dict[str, str]] = {}
