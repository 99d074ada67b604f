"""The newest intact checkpoint: a version that cannot be read is reported in one line and passed over.

Orbax commits a version atomically (a kill mid-save leaves only a ``*.orbax-checkpoint-tmp`` directory, removed by
the next run), but a committed version can still be torn afterwards: a disk that filled, a copy cut short, a file
truncated by hand or by a broken filesystem. Reading such a version raises a long TensorStore error whose useful
part is deep in its cause chain. ``restore_newest_intact`` tries the versions newest first, reports each unreadable
one as ``checkpoint version N is unreadable: FILE: REASON``, and returns the first that reads, saying so;
``fallback=False`` refuses instead (``CheckpointUnreadable``, naming the intact versions a user can ask for).

Used by training (``Loop.restore_latest``) and evaluation (``load_policy``). Training then deletes the torn
versions it passed over (``drop``), else its next save at that version would be skipped as already present.
"""

from __future__ import annotations

import re
import sys
from typing import Any, Callable, TypeVar

from sera_jax.config.errors import UserError

T = TypeVar("T")


class CheckpointUnreadable(UserError):
    """The checkpoint asked for (the newest, or every one) cannot be read, and no fallback is allowed or left."""


def _reason(err: BaseException, where: str) -> str:
    """Returns one line naming the file and the cause of a restore error (the innermost message's first line)."""
    chain, e = [], err
    while e is not None and len(chain) < 10:
        chain.append(e)
        e = e.__cause__ or e.__context__
    texts = [str(x) for x in chain if str(x).strip()]
    paths = [m for t in texts for m in re.findall(r"[\"']?(/[^\s\"']+)", t) if where in m]
    inner = texts[-1].strip().splitlines()[0] if texts else type(err).__name__
    if len(inner) > 240:
        inner = inner[:237] + "..."
    file = paths[-1].rstrip("/") if paths else where
    return f"{file}: {inner}"


def _quiet_orbax_leftovers() -> None:
    """Drops the "Exception ignored in <coroutine ...>" reports of orbax's shard readers that a failed read leaves
    behind (they are finalised later, often at exit, each printing the error already reported in one line); every
    other unraisable exception still reaches the previous hook."""
    previous = sys.unraisablehook
    if getattr(previous, "_sera_quiet", False):
        return

    def hook(u):
        code = getattr(u.object, "cr_code", None)
        if code is not None and "orbax" in code.co_filename:
            return
        previous(u)

    hook._sera_quiet = True
    sys.unraisablehook = hook


def restore_newest_intact(versions: list[int], read: Callable[[int], T], *, directory: str, fallback: bool = True,
                          log: Callable[[str], None] = print) -> tuple[int, T, list[int]]:
    """Reads the newest of ``versions`` that ``read(version)`` can read; returns (version, what it read, the newer
    versions it passed over as unreadable).

    Each unreadable version is reported through ``log`` in one line (its file and reason). Raises
    ``CheckpointUnreadable`` when the newest is unreadable and ``fallback`` is False, or when none is readable."""
    torn: list[int] = []
    order = sorted(versions, reverse=True)
    for i, v in enumerate(order):
        try:
            out = read(v)
        except (KeyboardInterrupt, SystemExit, MemoryError, UserError):
            raise  # a user's mistake (another architecture) is not a torn file
        except Exception as e:
            _quiet_orbax_leftovers()
            line = f"checkpoint version {v} is unreadable: {_reason(e, f'{directory}/{v}')}"
            rest = order[i + 1:]
            if not fallback:
                hint = f"; intact ones may be among versions {rest} (--version)" if rest else ""
                raise CheckpointUnreadable(line + f" (fallback refused{hint})") from e
            if not rest:
                raise CheckpointUnreadable(line + "; no older version to fall back to") from e
            log(line + f"; falling back to version {rest[0]}")
            torn.append(v)
            continue
        if len(torn) > 1:  # with one, its line named the version used
            log(f"using checkpoint version {v}, the newest intact one (passed over: {torn})")
        return v, out, torn
    raise CheckpointUnreadable(f"no checkpoint in {directory}")


def drop(manager: Any, versions: list[int]) -> None:
    """Deletes the given versions from an orbax ``CheckpointManager`` (torn ones a resumed run will redo); returns
    None."""
    for v in versions:
        manager.delete(v)


ARCHITECTURE = ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads",
                "head_dim", "tie_word_embeddings")


def restore_same_architecture(checkpointer: Any, version: int, like: Any, model_config: dict | None) -> Any:
    """Returns ``checkpointer.restore(like, version)`` after checking that the version's recorded model config has
    ``model_config``'s architecture (skipped when either is unknown). Raises ``UserError`` naming the differing
    fields: a run directory of another architecture is the user's mistake, not a torn checkpoint."""
    saved = checkpointer.read_meta(version).get("model_config")
    if saved and model_config:
        diff = [f"{f}: {saved.get(f)} vs {model_config.get(f)}" for f in ARCHITECTURE
                if f in saved and f in model_config and saved[f] != model_config[f]]
        if diff:
            raise UserError(f"{checkpointer.directory} version {version} holds another architecture than this "
                            f"run's model ({'; '.join(diff)}); give another --out or the matching model")
    return checkpointer.restore(like, version)
