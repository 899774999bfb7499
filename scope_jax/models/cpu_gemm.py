"""Matmuls on XLA:CPU through MKL, called from the compiled program as an XLA FFI custom call
(docs/models.md, "The float32 GEMM on XLA:CPU").

`matmul(a, b)` is op(a) @ op(b). On XLA:CPU with one device it calls MKL's `cblas_sgemm_64` for two
float32 operands, and `cblas_gemm_bf16bf16f32_64` (float32 accumulation, on the AMX tiles where the CPU
has them) for two bfloat16 operands on a CPU with AVX512_BF16 or AMX-BF16. The handler (`cpu_gemm.cc`)
is built with the C++ compiler `$CXX` (default `c++`) against jaxlib's FFI headers on first use, and
cached under `$XDG_CACHE_HOME/scope_jax` (default `~/.cache`). It cuts each product into blocks, each a
single-threaded GEMM, and runs them on XLA's own intra-op threads.

Otherwise `matmul` is XLA's own dot: on every accelerator; for other dtypes, and bfloat16 on a CPU
without bfloat16 instructions; with several devices (XLA's partitioner cannot split the custom call: it
would gather the operands); with `SCOPE_JAX_CPU_GEMM=0`; and when MKL or the compiler is missing, which
is logged once. `SCOPE_JAX_CPU_GEMM=1` takes MKL with several devices too (the tests, which see eight).
The switch is read when a function is traced, and `cpu_attention`'s kernel follows it.

The custom call has no autodiff rule: call `matmul` inside a custom_vjp whose backward pass calls it
again (decoder's `projection` and `normed_swiglu_mlp`, LoRA's `adapted_matmul`, the head's `head_stats`).
Under vmap every operand gets the batch dimensions, which the handler loops over.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import importlib.metadata
import logging
import math
import os
import subprocess
from pathlib import Path

import jax
import jax.numpy as jnp
import jaxlib

from scope_jax.models.layouts import xla_cpu_layouts

TARGETS = {jnp.dtype(jnp.float32): "scope_jax_cpu_gemm", jnp.dtype(jnp.bfloat16): "scope_jax_cpu_gemm_bf16"}
CPU_BF16_FLAGS = ("amx_bf16", "avx512_bf16")  # /proc/cpuinfo flags under which MKL's bfloat16 GEMM is taken
SOURCE = Path(__file__).with_name("cpu_gemm.cc")
MKL_THREADING_SEQUENTIAL = 1  # MKL_Set_Threading_Layer's code: one thread per call; the handler splits
SWITCH = "SCOPE_JAX_CPU_GEMM"  # 0, 1 or auto (`uses_mkl`)

_loaded: list[ctypes.CDLL] = []  # the handler and MKL stay loaded for the life of the process


def matmul(a: jax.Array, b: jax.Array, *, transpose_a: bool = False, transpose_b: bool = False,
           preferred_element_type=None) -> jax.Array:
    """op(a) @ op(b) of 2-D a and b, op transposing when asked: a [m, k] (or [k, m]), b [k, n] (or [n, k]).
    The product has `preferred_element_type`, else the operands' dtype (MKL accumulates in float32)."""
    if a.ndim != 2 or b.ndim != 2:
        raise ValueError(f"cpu_gemm.matmul takes 2-D operands, got {a.shape} and {b.shape}")
    a_shape, b_shape = a.shape[::-1] if transpose_a else a.shape, b.shape[::-1] if transpose_b else b.shape
    if a_shape[1] != b_shape[0]:
        raise ValueError(f"cpu_gemm.matmul: op(a) {a_shape} and op(b) {b_shape} do not multiply")
    if not uses_mkl(a, b):
        return jnp.matmul(a.T if transpose_a else a, b.T if transpose_b else b,
                          preferred_element_type=preferred_element_type)
    result = jax.ShapeDtypeStruct((a_shape[0], b_shape[1]), jnp.float32)
    product = jax.ffi.ffi_call(TARGETS[a.dtype], result, vmap_method="broadcast_all")(
        a, b, transpose_a=transpose_a, transpose_b=transpose_b)
    return product.astype(preferred_element_type or a.dtype)


def dense(x: jax.Array, kernel: jax.Array, *, transpose_kernel: bool = False,
          preferred_element_type=None) -> jax.Array:
    """x [..., k] @ op(kernel), kernel [k, n] (or [n, k] transposed): `matmul` over x's rows."""
    if not uses_mkl(x, kernel):
        kernel = kernel.T if transpose_kernel else kernel
        return jnp.matmul(x, kernel, preferred_element_type=preferred_element_type)
    rows = x.reshape(math.prod(x.shape[:-1]), x.shape[-1])
    out = matmul(rows, kernel, transpose_b=transpose_kernel, preferred_element_type=preferred_element_type)
    return out.reshape(*x.shape[:-1], out.shape[-1])


def uses_mkl(a: jax.Array, b: jax.Array) -> bool:
    """Whether `matmul(a, b)` calls MKL (see the module docstring)."""
    setting = os.environ.get(SWITCH, "auto")
    if setting not in ("0", "1", "auto"):
        raise ValueError(f"{SWITCH}={setting!r}: expected 0 (off), 1 (on with several devices too) or auto")
    if setting == "0" or a.dtype != b.dtype or a.dtype not in TARGETS or not xla_cpu_layouts():
        return False
    if a.dtype == jnp.bfloat16 and not cpu_has_bf16():
        return False
    return (setting == "1" or jax.device_count() == 1) and handler_registered()


@functools.cache
def handler_registered() -> bool:
    """Build (or find cached), load and register the handler once per process; False, logged, on failure."""
    return registered(SOURCE, ("cblas_sgemm_64", "cblas_gemm_bf16bf16f32_64"),
                      dict(zip(TARGETS.values(), ("CpuGemm", "CpuGemmBf16"))), "the matmuls use XLA's dot")


def registered(source: Path, mkl_functions: tuple[str, ...], targets: dict[str, str], fallback: str) -> bool:
    """Build (or find cached) and load `source`'s handler library, hand MKL's `mkl_functions` to its
    `set_functions`, and register its handlers for the CPU (`targets`: FFI target name -> symbol); False,
    logged as a warning ending with `fallback` on the logger of the module beside `source`, on failure."""
    try:
        handler = ctypes.CDLL(str(build(os.environ.get("CXX", "c++"), source)))
        library = mkl()
        handler.set_functions(*(ctypes.cast(getattr(library, f), ctypes.c_void_p) for f in mkl_functions))
        for target, symbol in targets.items():
            jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(handler, symbol)), platform="cpu")
    except (OSError, ImportError, AttributeError, RuntimeError) as e:
        logging.getLogger(f"{__package__}.{source.stem}").warning(
            "%s: the handler is unavailable (%s); %s", source.stem, e, fallback)
        return False
    _loaded.append(handler)
    return True


@functools.cache
def mkl() -> ctypes.CDLL:
    """libmkl_rt, loaded once per process with its sequential threading layer (OSError if it cannot be)."""
    library = ctypes.CDLL(_mkl_path())
    if library.MKL_Set_Threading_Layer(ctypes.c_int(MKL_THREADING_SEQUENTIAL)) != MKL_THREADING_SEQUENTIAL:
        raise OSError("MKL did not take its sequential threading layer")
    _loaded.append(library)
    return library


@functools.cache
def cpu_has_bf16() -> bool:
    """Whether /proc/cpuinfo lists a bfloat16 instruction set (`CPU_BF16_FLAGS`)."""
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False
    return any(flag in flags for flag in CPU_BF16_FLAGS)


def build(compiler: str, source: Path = SOURCE) -> Path:
    """The compiled handler of `source`, built by `compiler` unless the cache holds it for this source, the
    headers beside it and jaxlib."""
    include = jax.ffi.include_dir()
    headers = b"".join(h.read_bytes() for h in sorted(source.parent.glob("*.h")))
    key = hashlib.sha256(source.read_bytes() + headers + f"{jaxlib.__version__} {include}".encode())
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "scope_jax"
    target = cache / f"{source.stem}-{key.hexdigest()[:16]}.so"
    if target.exists():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(f".{os.getpid()}.partial")  # concurrent builds never see a half-written file
    command = [compiler, "-O3", "-shared", "-fPIC", "-std=c++17", "-w", f"-I{include}", f"-I{source.parent}",
               str(source), "-o", str(partial)]
    try:
        built = subprocess.run(command, capture_output=True, text=True)
    except OSError as e:
        raise RuntimeError(f"cannot run the C++ compiler {compiler!r}: {e}") from e
    if built.returncode != 0:
        last = (built.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"{compiler!r} failed to build {source.name} (exit {built.returncode}): {last}")
    os.replace(partial, target)
    return target


def _mkl_path() -> str:
    """libmkl_rt of the `mkl` distribution (pip puts it in the environment's lib/)."""
    try:
        files = importlib.metadata.files("mkl") or []
    except importlib.metadata.PackageNotFoundError:
        raise OSError("the mkl package is not installed") from None
    found = [f.locate() for f in files if f.name.startswith("libmkl_rt.")]
    if not found:
        raise OSError("the mkl package holds no libmkl_rt")
    return str(Path(found[0]).resolve())
