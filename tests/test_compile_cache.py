"""The persistent compilation cache (specjax.compile_cache): programs are written under
specjax's cache and read back after the in-memory caches are gone; a folder the caller gave JAX
is kept; $SPECJAX_COMPILATION_CACHE=0 turns it off."""

import jax
import jax.numpy as jnp
import pytest
from jax._src import monitoring
from jax.experimental.compilation_cache import compilation_cache

from specjax.compile_cache import ENV, enable_compilation_cache


@pytest.fixture
def restore_jax_cache_config(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    old_dir = jax.config.jax_compilation_cache_dir
    old_min = jax.config.jax_persistent_cache_min_compile_time_secs
    yield
    jax.config.update("jax_compilation_cache_dir", old_dir)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", old_min)
    compilation_cache.reset_cache()


def _compile_once(scale: float):
    @jax.jit
    def f(x):
        for i in range(40):  # enough work that compiling takes longer than the cache's minimum
            x = jnp.tanh(x @ x.T + i * scale)
        return x

    return f(jnp.ones((16, 16))).block_until_ready()


def test_compiled_programs_are_read_back_from_disk(tmp_path, monkeypatch, restore_jax_cache_config):
    monkeypatch.setenv("SPECJAX_CACHE", str(tmp_path))
    jax.config.update("jax_compilation_cache_dir", None)
    jax.jit(lambda x: x + 1)(1.0)  # a compilation before the cache is on (as after a load)
    folder = enable_compilation_cache()
    assert folder == tmp_path / "xla"

    events = []

    def listen(name, **kwargs):
        events.append(name)

    monitoring.register_event_listener(listen)
    try:
        first = _compile_once(0.123)
        assert any(p.name.startswith("jit_f") for p in folder.iterdir())
        jax.clear_caches()  # what a new process starts with: nothing compiled in memory
        events.clear()
        again = _compile_once(0.123)
    finally:
        monitoring.unregister_event_listener(listen)
    assert "/jax/compilation_cache/cache_hits" in events
    assert jnp.array_equal(first, again)


def test_a_folder_given_to_jax_is_kept_and_the_switch_turns_it_off(
    tmp_path, monkeypatch, restore_jax_cache_config
):
    jax.config.update("jax_compilation_cache_dir", str(tmp_path / "mine"))
    assert enable_compilation_cache(tmp_path / "other") == tmp_path / "mine"
    assert jax.config.jax_compilation_cache_dir == str(tmp_path / "mine")

    jax.config.update("jax_compilation_cache_dir", None)
    monkeypatch.setenv(ENV, "0")
    assert enable_compilation_cache(tmp_path / "other") is None
    assert jax.config.jax_compilation_cache_dir is None
    assert not (tmp_path / "other").exists()
