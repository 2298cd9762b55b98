"""The workdir a recipe syncs, and the files its `run:` names that would not reach the node.

Default (no `workdir:`): the recipe's own directory when `run:` names a file in it (`python
train.py` beside the recipe: what a user means), otherwise nothing is synced. Never a directory
that holds secrets cloudtrain or SSH keep (the home directory, $CLOUDTRAIN_HOME or one above it):
that needs an explicit `workdir:`.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from cloudtrain import paths


def run_files(run: str | None) -> list[str]:
    """The words of `run:` that could be relative file paths (no option, variable or absolute path)."""
    words: list[str] = []
    for line in (run or "").splitlines():
        try:
            tokens = shlex.split(line, comments=True)
        except ValueError:
            continue  # an unbalanced quote: the shell will say so on the node
        for token in tokens:
            if token.startswith(("-", "$", "/", "~")) or "=" in token or not token.strip(". /"):
                continue
            words.append(token)
    return words


def resolve_workdir(run: str | None, base: Path, workdir: Path | None) -> tuple[Path | None, list[str]]:
    """(the workdir to sync, warnings) for a recipe in directory `base`; `workdir` is the recipe's, resolved."""
    named = [w for w in dict.fromkeys(run_files(run)) if (base / w).is_file()]
    if workdir is not None:
        left_out = [w for w in named if not (workdir / w).exists()]
        return workdir, [f"run: names {w}, which is beside the recipe but not in workdir {workdir}: it will not "
                         f"be on the node (move it, or set workdir: to the directory that holds it)" for w in left_out]
    if not named:
        return None, []
    unsafe = _holds_secrets(base)
    if unsafe:
        return None, [f"run: names {', '.join(named)} beside the recipe, but its directory {base} {unsafe}, so it is "
                      f"not synced by default: the file(s) will not be on the node (set workdir: to a project "
                      f"directory)"]
    return base, []


def _holds_secrets(directory: Path) -> str | None:
    home = Path.home().resolve()
    if directory == home:
        return "is your home directory"
    ct_home = paths.home_path().resolve()
    if ct_home == directory or directory in ct_home.parents:
        return f"holds cloudtrain's keys and state ({ct_home})"
    return None
