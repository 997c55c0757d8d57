"""Know what really ran (being split by question; see host.py)."""

from .host import *  # noqa: F401,F403
from .host import (MATCHED, MISMATCHED, NOT_REPORTED, SCHEMA_VERSION, __all__,  # noqa: F401
                   _check_schema)
