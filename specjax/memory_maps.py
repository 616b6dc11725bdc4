"""Memory mappings of compiled programs: a long process can run out of them before memory.

XLA:CPU keeps each compiled program's machine code in memory mappings of its own, about 600 for
one speculative program of SmolLM2 and ~850 for its prefill plus plain decoding (counted in
/proc/self/maps on Linux; NOTES.md, "Twenty-fifth session"). Linux caps a process's mappings at
vm.max_map_count, 65530 by default, so a process that compiles ~100 such programs without
dropping any (a benchmark over many methods and prompt lengths, a server seeing many shapes)
reaches the cap with most of its memory free. The next compile then fails inside LLVM ("LLVM
compilation error: Cannot allocate memory") and the process usually dies with a segmentation
fault, far from the cause.

`watch()` (called by `import specjax`) checks the count after every XLA compile and warns once
the process holds WARN_SHARE of the cap, naming both ways out: raise the cap, or drop compiled
programs that are no longer needed (`drop_compiled_programs`, which long-running specjax tools
call between independent groups of work through `drop_compiled_programs_if_crowded`).
"""

from __future__ import annotations

import gc
import warnings
from collections.abc import Callable
from pathlib import Path

MAX_MAP_COUNT = Path("/proc/sys/vm/max_map_count")
SELF_MAPS = Path("/proc/self/maps")
WARN_SHARE = 0.8  # share of the cap in use at which a compile warns
DROP_SHARE = 0.5  # share at which drop_compiled_programs_if_crowded drops them
# The event JAX records after each backend compile (jax._src.dispatch.BACKEND_COMPILE_EVENT).
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"

_watching = False
_warned = False


def mapping_limit() -> int | None:
    """vm.max_map_count, the most memory mappings a process may hold; None off Linux."""
    try:
        return int(MAX_MAP_COUNT.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def mappings_in_use() -> int | None:
    """Memory mappings this process holds now (lines of /proc/self/maps); None off Linux."""
    try:
        with SELF_MAPS.open("rb") as f:
            return sum(1 for _ in f)
    except OSError:
        return None


def share_in_use() -> float | None:
    """mappings_in_use() / mapping_limit(); None where either is unknown."""
    limit, used = mapping_limit(), mappings_in_use()
    if not limit or used is None:
        return None
    return used / limit


def crowded_message(used: int, limit: int) -> str:
    return (
        f"this process holds {used} of the {limit} memory mappings Linux allows it "
        "(vm.max_map_count). XLA:CPU maps every compiled program (~600 mappings for a "
        "speculative program of a 135M model), and a compile past the cap fails ('LLVM "
        "compilation error: Cannot allocate memory') and can crash the process. Raise the cap "
        "(sudo sysctl -w vm.max_map_count=1048576) or drop compiled programs that are no longer "
        "needed (jax.clear_caches(), or specjax.memory_maps.drop_compiled_programs())."
    )


def _after_compile(event: str, duration: float, **kwargs) -> None:
    global _warned
    if _warned or event != COMPILE_EVENT:
        return
    limit, used = mapping_limit(), mappings_in_use()
    if limit and used is not None and used >= WARN_SHARE * limit:
        _warned = True
        warnings.warn(crowded_message(used, limit), RuntimeWarning, stacklevel=2)


def watch() -> bool:
    """Check the mappings after every XLA compile of this process and warn once when they reach
    WARN_SHARE of the cap. Idempotent; False (nothing watched) off Linux."""
    global _watching
    if _watching:
        return True
    if mapping_limit() is None:
        return False
    import jax

    jax.monitoring.register_event_duration_secs_listener(_after_compile)
    _watching = True
    return True


def drop_compiled_programs() -> None:
    """Drop every compiled program of this process (they compile again when called; with the
    compilation cache on, they are read back from disk), returning their mappings."""
    import jax

    jax.clear_caches()
    gc.collect()  # the executables go, and their mappings with them, once nothing holds them


def drop_compiled_programs_if_crowded(
    share: float = DROP_SHARE, log: Callable[[str], None] | None = None
) -> bool:
    """drop_compiled_programs() when the process holds at least `share` of its mapping cap;
    returns whether it did. For a tool between groups of work that share no compiled programs
    it needs later (a benchmark between prompt sets): the cost is compiling them again."""
    limit, used = mapping_limit(), mappings_in_use()
    if not limit or used is None or used < share * limit:
        return False
    drop_compiled_programs()
    if log is not None:
        after = mappings_in_use()
        log(
            f"[specjax] {used} of {limit} memory mappings in use (vm.max_map_count): dropped "
            f"the compiled programs ({after} left); they compile again where needed"
        )
    return True
