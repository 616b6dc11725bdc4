"""Few-row products on the CPU: a small C++ kernel (XLA FFI) over weights packed in panels.
(The same library holds the attention over the KV cache read in place, `cache_attention`, and a
row's argmax and draw, `row_choice`.)

`panel_product(x, layer, panels, out)` computes x [..., I] times layer `layer`'s weight, where
each weight w [O, I] is stored packed as [P, I, 32] (P = ceil(O / 32); `pack`, `unpack`). The
layer index is an operand, so a layer scan reads its layer's buffer in place: no `lax.switch`
over per-layer branches and no copy out of a stack.

Why: on XLA:CPU a product of 2-8 rows (a verification block of tree nodes) by a float32 weight
costs ~2x the one-row product, because the matrix-matrix routine packs the weight on every call
(see panel_product.cc); the kernel reads each panel once for up to 8 rows, so SmolLM2's forward
over 8 nodes costs close to a one-token forward. Each output is accumulated in a fixed order,
whatever the number of rows, so a row's result does not depend on the block it came in.

The kernel is compiled on first use with the system's C++ compiler (`-O3 -march=native`, ~5 s)
into the specjax cache folder ($SPECJAX_CACHE, else ~/.cache/specjax) and reused from there.
Where that fails (no compiler, another architecture) or SPECJAX_CPU_PANELS=0, `available()` is
False (with a one-line warning saying why) and the models keep XLA's products.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from specjax.paths import cache_dir

PANEL = 32  # output lanes per panel (panel_product.cc's kPanel)
TARGET = "specjax_panel_product"
ATTENTION_TARGET = "specjax_cache_attention"
ARGMAX_TARGET = "specjax_row_argmax"
DRAW_TARGET = "specjax_row_draw"
SOURCES = tuple(sorted(Path(__file__).parent.glob("*.cc")))  # compiled into one library
ENV_SWITCH = "SPECJAX_CPU_PANELS"

_state: dict = {}  # "ok": bool once decided; "why": the reason it is off


def _cpu_flags() -> str:
    """What -march=native compiles for: the CPU's model and feature flags (Linux), else the
    machine name."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.machine()
    lines = [ln for ln in text.splitlines() if ln.startswith(("model name", "flags"))]
    return "\n".join(sorted(set(lines)))


@functools.cache
def source_digest() -> str:
    """A digest of the kernels' source: measured costs of packed models are keyed by it (a
    changed kernel may cost differently: specjax.autotune.cost_key)."""
    text = "\n".join(source.read_text() for source in SOURCES)
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def _library_path(compiler: str) -> Path:
    version = subprocess.run(
        [compiler, "--version"], capture_output=True, text=True, check=False
    ).stdout.splitlines()[:1]
    key = "\n".join(
        [
            *(source.read_text() for source in SOURCES),
            jax.__version__,
            platform.machine(),
            _cpu_flags(),
            *version,
        ]
    )
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return cache_dir() / "kernels" / f"cpu_kernels-{digest}.so"


def _build(library: Path, compiler: str) -> None:
    library.parent.mkdir(parents=True, exist_ok=True)
    # Compiled into a temporary name and renamed: processes building at once never load a
    # half-written library.
    with tempfile.NamedTemporaryFile(dir=library.parent, suffix=".so", delete=False) as tmp:
        partial = Path(tmp.name)
    cmd = [
        compiler, "-O3", "-march=native", "-std=c++17", "-fPIC", "-shared", "-w",
        f"-I{jax.ffi.include_dir()}", *map(str, SOURCES), "-o", str(partial),
    ]  # fmt: skip
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode:
            errors = [ln for ln in done.stderr.splitlines() if "error" in ln]
            raise RuntimeError(f"{compiler} failed: {(errors or ['no output'])[0].strip()}")
        partial.replace(library)
    finally:
        partial.unlink(missing_ok=True)


def _load() -> None:
    if os.environ.get(ENV_SWITCH, "1") == "0":
        raise RuntimeError(f"{ENV_SWITCH}=0")
    if platform.machine().lower() not in ("x86_64", "amd64"):
        raise RuntimeError(f"written for x86-64, this machine is {platform.machine()}")
    compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        raise RuntimeError("no C++ compiler found (install g++ or set CXX)")
    library = _library_path(compiler)
    if not library.exists():
        print("specjax: compiling the CPU kernels (once per machine)", file=sys.stderr)
        _build(library, compiler)
    lib = ctypes.cdll.LoadLibrary(str(library))
    jax.ffi.register_ffi_target(TARGET, jax.ffi.pycapsule(lib.SpecjaxPanelProduct), platform="cpu")
    for target, symbol in (
        (ATTENTION_TARGET, lib.SpecjaxCacheAttention),
        (ARGMAX_TARGET, lib.SpecjaxRowArgmax),
        (DRAW_TARGET, lib.SpecjaxRowDraw),
    ):
        jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(symbol), platform="cpu")


def available() -> bool:
    """Whether the panel kernel can run here (built and registered on the first call)."""
    if "ok" not in _state:
        try:
            _load()
            _state["ok"] = True
        except Exception as err:  # noqa: BLE001 - any failure means: keep XLA's products
            _state["ok"], _state["why"] = False, str(err)
            if os.environ.get(ENV_SWITCH, "1") != "0":
                warnings.warn(
                    f"specjax: the CPU kernels are off ({err}); using XLA's products and attention",
                    stacklevel=2,
                )
    return _state["ok"]


def why_unavailable() -> str:
    """Why the kernels are off here ("" when they run, or before available() was asked)."""
    return _state.get("why", "")


def _traced(w) -> bool:
    return isinstance(w, jax.core.Tracer) or not isinstance(w, (jax.Array, np.ndarray))


def pack(w, dtype=jnp.float32) -> jax.Array:
    """w [O, I] -> panels [P, I, 32] of `dtype` (float32 or bfloat16; zero rows past O), a
    buffer of its own (packed on the host where w is concrete, traced otherwise, e.g. under
    nnx.eval_shape)."""
    out, inner = w.shape
    count = -(-out // PANEL)
    if _traced(w):
        padded = jnp.pad(w.astype(dtype), ((0, count * PANEL - out), (0, 0)))
        return padded.reshape(count, PANEL, inner).transpose(0, 2, 1)
    padded = np.zeros((count * PANEL, inner), dtype)
    padded[:out] = np.asarray(w).astype(dtype)
    return jnp.asarray(np.ascontiguousarray(padded.reshape(count, PANEL, inner).transpose(0, 2, 1)))


def pack_exact(w) -> jax.Array:
    """pack(w) in bfloat16 where every value of a concrete w is a bfloat16 (a drafter's weights,
    stored in bfloat16: the kernel's products are then the same, bit for bit, for half the bytes
    read), else in float32."""
    if not _traced(w):
        host = np.asarray(w, np.float32)
        if np.array_equal(host.astype(jnp.bfloat16).astype(np.float32), host):
            return pack(host, jnp.bfloat16)
    return pack(w)


def unpack(panels, out: int):
    """panels [P, I, 32] -> w [out, I] float32 (a host array where panels is concrete)."""
    count, inner, _ = panels.shape
    if _traced(panels):
        w = panels.transpose(0, 2, 1).reshape(count * PANEL, inner)[:out]
        return w.astype(jnp.float32)
    p = np.asarray(panels).astype(np.float32)
    return np.ascontiguousarray(p.transpose(0, 2, 1).reshape(count * PANEL, inner)[:out])


def value_at(panels, o: int, i: int) -> float:
    """w[o, i] of a packed weight, read in place."""
    return float(np.asarray(panels)[o // PANEL, i, o % PANEL])


def panel_product(x: jax.Array, layer, panels: tuple, out: int) -> jax.Array:
    """x [..., I] float32 times weight `layer` of `panels` (each [P, I, 32], float32 or
    bfloat16; products and sums in float32) -> [..., out].

    Differentiable in x and in the panels (a packed net still trains: the gradient of a
    packed weight is the packed gradient of the weight)."""
    return _product(x.astype(jnp.float32), jnp.asarray(layer, jnp.int32).reshape(()), panels, out)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _product(x, layer, panels, out):
    call = jax.ffi.ffi_call(
        TARGET, jax.ShapeDtypeStruct((*x.shape[:-1], out), jnp.float32), vmap_method="sequential"
    )
    return call(x, layer, *panels)


def _product_fwd(x, layer, panels, out):
    return _product(x, layer, panels, out), (x, layer, panels)


def _product_bwd(out, residuals, g):
    x, layer, panels = residuals
    weight = jax.lax.switch(layer, [lambda p=p: unpack(p, out) for p in panels])  # [out, I]
    grad_w = pack(jnp.einsum("...o,...i->oi", g, x))  # packing is linear
    grad_panels = tuple(
        jnp.where(layer == k, grad_w, 0.0).astype(p.dtype) for k, p in enumerate(panels)
    )
    return g @ weight, None, grad_panels


_product.defvjp(_product_fwd, _product_bwd)
