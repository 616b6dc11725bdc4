"""Compiled programs kept on disk: JAX's persistent compilation cache under specjax's cache.

Most of the time a new process spends before its first token is compilation: the speculative
loop, prefill, plain decoding and whatever the default call times all compile their XLA
programs again in every process. With the cache on, a program compiled once on this machine
(same program, backend, flags and jax version: JAX keys the entries by all of them) is read
back instead. The `specjax` command line turns it on; code that calls specjax from its own
process turns it on with `enable_compilation_cache()` before loading a model.
"""

from __future__ import annotations

import os
from pathlib import Path

# Set to 0 to keep the command line from turning the cache on.
ENV = "SPECJAX_COMPILATION_CACHE"
# Programs that compile faster than this are not written (JAX's default is 1 s). Reading an
# entry back costs milliseconds, and the default call's many sub-second programs (the target's
# forward at each measured node count, the drafter's levels) are most of what a new process
# would compile again.
MIN_COMPILE_SECONDS = 0.1


def enable_compilation_cache(folder: str | Path | None = None) -> Path | None:
    """Keep compiled programs in `folder` (default: the `xla` folder of specjax's cache,
    $SPECJAX_CACHE, else ~/.cache/specjax) and read them back in later processes.

    A folder already given to JAX (`jax_compilation_cache_dir`) is kept and returned. Returns
    None, changing nothing, when $SPECJAX_COMPILATION_CACHE=0. Programs compiled before the
    call are not written: call it before loading a model.
    """
    import jax
    from jax.experimental.compilation_cache import compilation_cache

    if os.environ.get(ENV, "1").strip() == "0":
        return None
    current = jax.config.jax_compilation_cache_dir
    if current:
        return Path(current)
    if folder is None:
        from specjax.paths import cache_dir

        folder = cache_dir() / "xla"
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_SECONDS)
    # JAX opens the folder at the first compilation after it is set, so programs compiled
    # before this call (a model's loading) do not keep the cache off.
    compilation_cache.set_cache_dir(str(folder))
    return folder
