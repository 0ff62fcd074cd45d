"""The built kernels' library and its C headers agree, and the production library carries no
benchmark knobs (issue #30; docs/kernels.md "Two builds").

- build/kernels/libopslot_kernels.so (what opslot loads) exports no `*set_tuning*` /
  `*set_experiment*` / `*set_hint*` / `*_probe_*` symbol, and exports exactly the `OPSLOT_API` functions declared in
  kernels/include/opslot_kernels/*.h except bench.h: none missing, none undeclared;
- every entry point the Python binding (runtime/opslot/kernels/cuda/*.py) or the torch ops' table
  (kernels/torch/kernel_table.h) names is declared in a production header and exported;
  libopslot_torch.so exports only its two C functions;
- bench.h declares only knobs (and probes); the bench library (when built) exports the production entry points
  plus exactly bench.h's;
- `_lib.using_library` makes the binding's entry points call another library, and restores them.

The dynamic symbol table is read from the ELF file with Python (no GPU, no binutils needed). Skips
only when the library was not built (KERNELS=OFF, or no build yet).
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import struct
from pathlib import Path
from typing import Dict, Set

import pytest

REPO = Path(__file__).resolve().parents[2]
HEADERS = REPO / "kernels" / "include" / "opslot_kernels"
BINDINGS = REPO / "runtime" / "opslot" / "kernels" / "cuda"
TABLE = REPO / "kernels" / "torch" / "kernel_table.h"
# knobs (set_hint: an experiment's input), and probes that read the kernels' counters
KNOB = re.compile(r"set_tuning|set_experiment|set_hint|_probe_")


def _build_dir() -> Path:
    """The CMake build folder under test: ctest passes PATCHGEN_BIN (<build>/tools/patchgen/patchgen);
    by hand, <checkout>/build."""
    patchgen = os.environ.get("PATCHGEN_BIN")
    if patchgen:
        return Path(patchgen).resolve().parents[2]
    return REPO / "build"


def _library(name: str) -> Path:
    build = _build_dir()
    path = build / "kernels" / name
    if path.is_file():
        return path
    cache = build / "CMakeCache.txt"
    if cache.is_file() and "PATCHGEN_KERNELS:BOOL=OFF" in cache.read_text(errors="replace"):
        pytest.skip(f"{name} not built: {build} is configured with KERNELS=OFF (PATCHGEN_KERNELS=OFF)")
    pytest.skip(f"{name} not built: {path} does not exist (build it with `make kernels`)")


def exported_functions(path: Path) -> Set[str]:
    """Names of the functions a shared library exports: defined, global or weak, default or
    protected visibility symbols of type FUNC in .dynsym (ELF64 little-endian, what nvcc builds)."""
    data = path.read_bytes()
    assert data[:4] == b"\x7fELF" and data[4] == 2 and data[5] == 1, f"{path}: not an ELF64 little-endian file"
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names: Set[str] = set()
    for sh_name, sh_type, _, _, sh_offset, sh_size, sh_link, _, _, sh_entsize in sections:
        if sh_type != 11:  # SHT_DYNSYM
            continue
        str_off = sections[sh_link][4]
        for i in range(sh_size // sh_entsize):
            st_name, st_info, st_other, st_shndx, _, _ = struct.unpack_from("<IBBHQQ", data, sh_offset + i * sh_entsize)
            bind, kind, vis = st_info >> 4, st_info & 0xF, st_other & 0x3
            if st_shndx == 0 or kind != 2 or bind not in (1, 2) or vis not in (0, 3):
                continue  # undefined, not a function, local, or hidden/internal
            end = data.index(b"\0", str_off + st_name)
            names.add(data[str_off + st_name : end].decode())
    return names


def declared_functions(header: Path) -> Set[str]:
    """The `OPSLOT_API` functions a header declares (comments and preprocessor lines ignored)."""
    text = header.read_text()
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    text = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    return set(re.findall(r"\bOPSLOT_API\b[^;{()]*?\b(opslot_\w+)\s*\(", text))


def _headers() -> Dict[str, Set[str]]:
    return {h.name: declared_functions(h) for h in sorted(HEADERS.glob("*.h"))}


def production_declarations() -> Set[str]:
    return set().union(*(names for name, names in _headers().items() if name != "bench.h"))


def binding_names() -> Dict[str, Set[str]]:
    """The C entry points each binding module names: quoted "opslot_..." strings (what it passes to
    fn / raw / function) and attribute accesses on the library (lib.opslot_...)."""
    out = {}
    for py in sorted(BINDINGS.glob("*.py")):
        text = py.read_text()
        names = set(re.findall(r"""["'](opslot_\w+)["']""", text)) | set(re.findall(r"\.(opslot_\w+)\b", text))
        names = {n for n in names if not n.startswith("opslot_torch_")}  # libopslot_torch.so's own
        if names:
            out[py.name] = names
    out[TABLE.name] = table_entry_points()
    return out


COMMON_ENTRIES = {"opslot_abi_version", "opslot_last_error", "opslot_check_device"}  # required when loading


def table_entry_points() -> Set[str]:
    """The X(opslot_...) entries of the torch ops' entry-point table (kernels/torch/kernel_table.h)."""
    return set(re.findall(r"\bX\((opslot_\w+)\)", TABLE.read_text()))


def test_headers_are_parsed():
    headers = _headers()
    assert {"common.h", "rms_norm.h", "bench.h"} <= set(headers)
    assert {"opslot_abi_version", "opslot_last_error", "opslot_build_info", "opslot_check_device"} <= headers[
        "common.h"
    ]
    assert {"opslot_rms_norm_fwd", "opslot_rms_norm_bwd", "opslot_rms_norm_bwd_partial_rows"} == headers["rms_norm.h"]
    assert len(production_declarations()) >= 30


def test_bench_header_declares_only_knobs_and_no_other_header_does():
    headers = _headers()
    assert headers["bench.h"] and all(KNOB.search(n) for n in headers["bench.h"]), headers["bench.h"]
    others = sorted(n for name, names in headers.items() if name != "bench.h" for n in names if KNOB.search(n))
    assert others == [], f"tuning knobs declared outside bench.h: {others}"


def test_production_library_exports_no_tuning_knobs():
    lib = _library("libopslot_kernels.so")
    knobs = sorted(n for n in exported_functions(lib) if KNOB.search(n))
    assert knobs == [], f"{lib} exports benchmark-only knobs: {knobs} (they belong in libopslot_kernels_bench.so)"


def test_production_library_exports_exactly_the_headers_entry_points():
    lib = _library("libopslot_kernels.so")
    exported = {n for n in exported_functions(lib) if n.startswith("opslot_")}
    declared = production_declarations()
    assert sorted(declared - exported) == [], f"declared in kernels/include/opslot_kernels/*.h, not exported by {lib}"
    assert sorted(exported - declared) == [], f"exported by {lib}, declared in no header"
    others = sorted(n for n in exported_functions(lib) if not n.startswith("opslot_"))
    assert others == [], f"{lib} exports symbols outside the C ABI: {others[:20]}"


def test_every_binding_entry_point_is_declared_and_exported():
    lib = _library("libopslot_kernels.so")
    exported, declared = exported_functions(lib), production_declarations()
    problems = []
    for module, names in binding_names().items():
        for name in sorted(names):
            if name not in declared:
                problems.append(f"{module}: {name} is declared in no production header")
            if name not in exported:
                problems.append(f"{module}: {name} is not exported by {lib.name}")
    assert problems == []
    assert sum(len(n) for n in binding_names().values()) >= 30  # the scan found the bindings


def test_the_torch_ops_table_calls_only_declared_entry_points():
    """kernel_table.h types each entry by decltype of its header prototype (a mismatch does not
    compile); here: the list is exactly the production entry points, and every torch-op source calls
    them through OPSLOT_LAUNCH / OPSLOT_ENTRY (which name an entry point a library lacks)."""
    table = table_entry_points()
    assert {"opslot_rms_norm_fwd", "opslot_rope", "opslot_silu_mul_fwd", "opslot_load_balancing_fwd"} <= table
    assert sorted(table - production_declarations()) == []
    called, direct = set(), []
    for cc in sorted(TABLE.parent.glob("*.cc")):
        text = cc.read_text()
        called |= set(re.findall(r"\bOPSLOT_(?:LAUNCH|ENTRY)\(\w+, (opslot_\w+)", text))
        direct += [f"{cc.name}: {n}" for n in re.findall(r"\.(opslot_\w+)\(", text) if n not in COMMON_ENTRIES]
    assert called and sorted(called - table) == []
    assert direct == [], "entry points called without OPSLOT_LAUNCH/OPSLOT_ENTRY (which name a missing one)"
    assert sorted(production_declarations() - table) == [], "kernel_table.h lacks entry points"


def test_torch_ops_library_exports_only_its_two_functions():
    lib = _library("libopslot_torch.so")
    exported = {n for n in exported_functions(lib) if n.startswith("opslot")}
    assert exported == {"opslot_torch_use_library", "opslot_torch_library_path"}


def test_bench_library_adds_exactly_the_knobs():
    prod = {n for n in exported_functions(_library("libopslot_kernels.so")) if n.startswith("opslot_")}
    bench = _build_dir() / "kernels" / "libopslot_kernels_bench.so"
    if not bench.is_file():
        pytest.skip(f"{bench} not built (cmake --build build --target opslot_kernels_bench)")
    exported = {n for n in exported_functions(bench) if n.startswith("opslot_")}
    assert sorted(exported - prod) == sorted(_headers()["bench.h"])
    assert sorted(prod - exported) == []


def test_using_library_swaps_the_entry_points(monkeypatch, tmp_path):
    """using_library(path): the binding's entry points (function(), _ops_common.raw) resolve in that
    library inside the block and in the previous one after it. Loading needs no GPU."""
    from opslot.kernels.cuda import _lib, _ops_common

    prod = _library("libopslot_kernels.so")
    other = _build_dir() / "kernels" / "libopslot_kernels_bench.so"
    if not other.is_file():  # a second copy is a second library for the dynamic loader
        other = tmp_path / "libopslot_kernels_copy.so"
        shutil.copyfile(prod, other)
    monkeypatch.setenv(_lib.ENV_VAR, str(prod))
    monkeypatch.setattr(_lib, "_lib", None)
    monkeypatch.setattr(_lib, "_error", None)
    monkeypatch.setattr(_lib, "_checked_devices", {})
    monkeypatch.setattr(_ops_common, "_raw", {})

    def address():
        f = _ops_common.raw("opslot_abi_version", ctypes.c_int, [])
        assert f() == _lib.ABI_VERSION
        return ctypes.cast(f, ctypes.c_void_p).value

    version = _lib.function("opslot_abi_version", [])  # returns 1: "fails" with the library's message
    base = address()
    with _lib.using_library(other) as lib:
        assert lib._opslot_path == str(other) and _lib.library() is lib
        inside = address()
        with pytest.raises(RuntimeError, match="opslot_abi_version failed"):
            version()
    assert inside != base
    assert _lib.library()._opslot_path == str(prod) and address() == base
