"""The version of the dicts the provenance records write, shared by every record."""

from __future__ import annotations

from typing import Any, Mapping

from bisect_harness.errors import UserError

#: Version of the dicts written by ``to_dict`` on the top-level results.
SCHEMA_VERSION = 1


def _check_schema(d: Mapping[str, Any], kind: str) -> None:
    v = d.get("schema_version", SCHEMA_VERSION)
    if not isinstance(v, int) or v > SCHEMA_VERSION:
        raise UserError(
            f"{kind} record has schema_version {v!r}, newer than this harness understands "
            f"({SCHEMA_VERSION}); upgrade bisect-harness to read it.")
