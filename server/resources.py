"""Where the data shipped with Conclave lives: the team presets and the SKILL.md packs.

``configs/`` and ``skills/`` are installed as the packages ``conclave.configs`` and
``conclave.skills``. Both hold an ``__init__.py`` so that importlib.resources resolves them the
same way in an installed wheel (``site-packages/conclave/configs``) and in an editable install
(the ``configs/`` folder of the source tree, through setuptools' editable finder).
"""

from __future__ import annotations

import importlib
from importlib.resources import files
from pathlib import Path

__all__ = ["configs_dir", "skills_dir"]


def _package_dir(package: str) -> Path:
    found = files(package)
    if isinstance(found, Path):
        return found
    # Not a plain folder (e.g. a namespace package's MultiplexedPath): fall back to the
    # package's own file, which exists because the folder has an __init__.py.
    module = importlib.import_module(package)
    if module.__file__ is None:
        raise RuntimeError(f"cannot locate the folder of package {package!r}")
    return Path(module.__file__).parent


def configs_dir() -> Path:
    """The folder of the team presets shipped with Conclave (``*.yaml``)."""
    return _package_dir("conclave.configs")


def skills_dir() -> Path:
    """The folder of the SKILL.md packs shipped with Conclave (``<name>/SKILL.md``)."""
    return _package_dir("conclave.skills")
