"""Which backend boots a run: ``--backend``/``--slots`` over the file's ``backend:`` section."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from bisect_harness.errors import SpecError, UserError
from bisect_harness.backends import Backend

__all__ = ["check_options", "make_backend", "BACKEND_NAMES"]

BACKEND_NAMES = ("local", "slurm")


def check_options(kind: str, options: Mapping[str, Any], *, where: str = "backend") -> None:
    """Raise SpecError naming the key when ``options`` do not fit backend ``kind``."""
    if kind == "local":
        if options:
            key = sorted(options)[0]
            raise SpecError(f"the local backend takes only kind and slots; {key!r} belongs to another backend "
                            "(set kind: slurm for cluster keys)", key=f"{where}.{key}")
        return
    from bisect_harness.backends.slurm import SlurmOptions

    SlurmOptions.from_mapping(options, where)


def make_backend(spec, *, kind: str | None = None, slots: int | None = None, log_dir: Path) -> Backend:
    """The backend a run boots through. Command-line values win over the file's."""
    kind = kind or spec.backend.kind
    if kind not in BACKEND_NAMES:
        raise UserError(f"--backend {kind!r}: one of {', '.join(BACKEND_NAMES)}")
    slots = slots if slots is not None else spec.backend.slots
    if slots < 1:
        raise UserError(f"--slots {slots}: at least 1")
    options = spec.backend.options_dict() if spec.backend.kind == kind else {}
    if kind == "local":
        from bisect_harness.backends.local import LocalBackend

        return LocalBackend(slots)
    from bisect_harness.backends.slurm import SlurmBackend, SlurmOptions

    return SlurmBackend(SlurmOptions.from_mapping(options, "backend"), slots=slots, folder=Path(log_dir) / "slurm")
