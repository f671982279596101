"""tandem-rl configuration: a pydantic v2 schema with verl's key names (configs layer).

Public entry point: ``load_config(source, overrides=())``.
"""

from configs.base import ConfigWarning
from configs.loader import ConfigError, load_config
from configs.schema import TandemConfig

__all__ = ["ConfigError", "ConfigWarning", "TandemConfig", "load_config"]
