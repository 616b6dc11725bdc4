"""specjax.memory_maps: the warning before XLA:CPU's compiled programs use up the process's
memory mappings, and dropping them."""

import warnings

import jax
import jax.numpy as jnp
import pytest

import specjax  # noqa: F401  (importing it starts the watch)
from specjax import memory_maps

linux_only = pytest.mark.skipif(
    memory_maps.mapping_limit() is None, reason="needs /proc/sys/vm/max_map_count (Linux)"
)


def _compile_new_programs(count: int, salt: float) -> list:
    """`count` programs XLA has not compiled before in this process (distinct constants)."""
    fns = []
    for i in range(count):
        f = jax.jit(lambda x, c=salt + i: jnp.tanh(x @ x.T + c).sum(0))
        f(jnp.ones((4, 4))).block_until_ready()
        fns.append(f)
    return fns


@linux_only
def test_compiled_programs_hold_mappings_that_dropping_them_returns():
    # A first round grows what the process keeps whatever it compiles (arenas, JIT memory).
    _compile_new_programs(20, salt=500.0)
    memory_maps.drop_compiled_programs()
    before = memory_maps.mappings_in_use()
    fns = _compile_new_programs(40, salt=1000.0)
    grown = memory_maps.mappings_in_use()
    assert grown >= before + 40, (before, grown)  # ~3 mappings per small program
    del fns
    memory_maps.drop_compiled_programs()
    after = memory_maps.mappings_in_use()
    assert after <= before + (grown - before) // 4, (before, grown, after)


@linux_only
def test_a_compile_warns_once_when_the_process_nears_its_mapping_cap(monkeypatch):
    assert memory_maps.watch()
    monkeypatch.setattr(memory_maps, "_warned", False)
    # Plenty of room: compiles stay quiet.
    monkeypatch.setattr(memory_maps, "mapping_limit", lambda: 10**9)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _compile_new_programs(1, salt=2000.0)
    # The cap just above what the process holds: the next compile warns, naming the fix.
    monkeypatch.setattr(memory_maps, "mapping_limit", lambda: memory_maps.mappings_in_use() + 5)
    with pytest.warns(RuntimeWarning, match=r"vm\.max_map_count.*sysctl.*clear_caches"):
        _compile_new_programs(1, salt=3000.0)
    # Once per process: later compiles do not repeat it.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _compile_new_programs(1, salt=4000.0)


@linux_only
def test_programs_are_dropped_only_when_the_mappings_are_crowded(monkeypatch):
    dropped = []
    monkeypatch.setattr(memory_maps, "drop_compiled_programs", lambda: dropped.append(True))
    used = memory_maps.mappings_in_use()
    monkeypatch.setattr(memory_maps, "mapping_limit", lambda: 4 * used)
    assert not memory_maps.drop_compiled_programs_if_crowded(share=0.5)
    assert not dropped
    lines = []
    monkeypatch.setattr(memory_maps, "mapping_limit", lambda: used + 10)
    assert memory_maps.drop_compiled_programs_if_crowded(share=0.5, log=lines.append)
    assert dropped and "vm.max_map_count" in lines[0]


def test_without_proc_nothing_is_watched_or_dropped(monkeypatch, tmp_path):
    monkeypatch.setattr(memory_maps, "MAX_MAP_COUNT", tmp_path / "absent")
    monkeypatch.setattr(memory_maps, "_watching", False)
    assert memory_maps.mapping_limit() is None
    assert memory_maps.share_in_use() is None
    assert not memory_maps.watch()
    assert not memory_maps.drop_compiled_programs_if_crowded(share=0.0)
