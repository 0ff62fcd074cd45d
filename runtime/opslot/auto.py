"""Auto classes over the generated modules: the module and class from the model type and the device,
generated for the installed Transformers on first use. See docs/auto.md.

    model = opslot.AutoModelForCausalLM.from_config(config, ops={...})
    model = opslot.AutoModelForCausalLM.from_pretrained(path, ops={...}, dtype=torch.bfloat16)

The class comes from `opslot.models.MODELS[config.model_type]` (the role of the auto class), the
module from the device (`opslot.current_device()`: the NPU sibling on Ascend, the GPU module on CUDA
and CPU machines; `target=` overrides), then `opslot.build_model` / `opslot.hf.from_pretrained` bind
the ops and build or load strictly.

Where the module file comes from (`locate_generated`), first match wins:

1. `generated_dir=` or else `$OPSLOT_GENERATED_DIR`: a folder of generated modules (patchgen's output
   root, `<dir>/<spec folder>/<module>.py`, or a flat `<dir>/<module>.py`). Explicit: the only place
   looked; a missing module or one generated for another Transformers release is an error.
2. The checkout's `generated/<spec folder>/<module>.py` when opslot runs from a checkout
   (runtime/opslot of this repository), if its version stamp is the installed Transformers'.
3. The per-user cache, `$OPSLOT_CACHE_DIR` (default `$XDG_CACHE_HOME/opslot`, `~/.cache/opslot`)
   `/generated/<transformers version>/<spec folder>/<module>.py`, generated there by patchgen
   (`$PATCHGEN`, `patchgen` on PATH, beside the interpreter, the checkout's build) from the specs
   (`$OPSLOT_SPECS_DIR`, the checkout's `specs/`, `opslot/_specs` in a wheel that carries them)
   against the installed Transformers, when absent or made from other specs. Under a file lock;
   patchgen writes atomically; nothing is ever deleted.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import threading
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, List, Optional, Tuple, Union

from . import hf
from .binding import _check_hf_config, build_model
from .checks import (
    VERSION_ENV,
    GeneratedVersionError,
    _env_allows,
    check_module_upstream,
    import_generated,
    read_header,
)
from .hardware import DeviceInfo, current_device
from .models import AUTO_CLASS_OF_ROLE, GeneratedModel, model_entry, target_for_device

logger = logging.getLogger("opslot.auto")

#: A folder of generated modules that replaces the automatic lookup (step 1).
GENERATED_DIR_ENV = "OPSLOT_GENERATED_DIR"
#: The specs folder patchgen generates the cache from.
SPECS_DIR_ENV = "OPSLOT_SPECS_DIR"
#: The cache root (default `$XDG_CACHE_HOME/opslot`, else `~/.cache/opslot`).
CACHE_DIR_ENV = "OPSLOT_CACHE_DIR"
#: The patchgen binary.
PATCHGEN_ENV = "PATCHGEN"
#: The upstream package of every real-model spec.
UPSTREAM_PACKAGE = "transformers"
#: Seconds one patchgen run may take.
PATCHGEN_TIMEOUT_S = 600
_LOCK_NAME = ".opslot-generate.lock"
_CONFIG_NAME = "patchgen.toml"


def _find_checkout() -> Optional[Path]:
    here = Path(__file__).resolve().parent
    root = here.parent.parent
    if here.parent.name == "runtime" and (root / "specs").is_dir() and (root / "runtime" / "pyproject.toml").is_file():
        return root
    return None


#: The repository root when opslot is imported from a checkout (its runtime/opslot), else None.
CHECKOUT: Optional[Path] = _find_checkout()
#: Specs a wheel of opslot may carry inside the package (docs/auto.md).
BUNDLED_SPECS: Path = Path(__file__).resolve().parent / "_specs"


class GeneratedModuleError(ImportError):
    """A generated module could not be found or generated; the message says how to fix it."""


@dataclass(frozen=True)
class GeneratedLocation:
    """Where a generated module was found: import name, file, which lookup step (`source`: "generated_dir=",
    "OPSLOT_GENERATED_DIR", "checkout" or "cache"), and the Transformers release of its version stamp."""

    module: str
    path: Path
    source: str
    version: str


# --- the installed Transformers ---------------------------------------------------------------------------


def installed_upstream() -> Tuple[str, Path]:
    """(version, source root) of the installed Transformers: the folder holding `transformers/`."""
    import transformers

    return transformers.__version__, Path(transformers.__file__).resolve().parents[1]


def cache_root() -> Path:
    env = os.environ.get(CACHE_DIR_ENV)
    if env:
        return Path(env).expanduser().absolute()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache").absolute() / "opslot"


def cache_dir(version: str) -> Path:
    """The cache folder of one Transformers release: patchgen's output root (and project root)."""
    return cache_root() / "generated" / re.sub(r"[^A-Za-z0-9._+-]", "_", version)


# --- lookup -------------------------------------------------------------------------------------------------


def _device_target(target: Optional[str], device: Optional[DeviceInfo]) -> str:
    return target if target is not None else target_for_device((device or current_device()).type)


def _header_version(path: Path) -> Optional[str]:
    """The version stamp of a Transformers module patchgen generated (None: no such file or header)."""
    header = read_header(path) if path.is_file() else None
    if header is None or header["package"] != UPSTREAM_PACKAGE:
        return None
    return header["version"]


def locate_generated(
    model_type: str,
    target: Optional[str] = None,
    *,
    device: Optional[DeviceInfo] = None,
    generated_dir: Union[str, os.PathLike, None] = None,
    allow_version_mismatch: bool = False,
) -> GeneratedLocation:
    """The file of `model_type`'s generated module for `target` ("gpu"/"npu"; default from `device`,
    else `opslot.current_device()`), generated into the cache when needed (module docstring)."""
    entry = model_entry(model_type)
    target = _device_target(target, device)
    module = entry.module(target)
    version, source_root = installed_upstream()
    explicit = (str(generated_dir), "generated_dir=") if generated_dir is not None else None
    if explicit is None and os.environ.get(GENERATED_DIR_ENV):
        explicit = (os.environ[GENERATED_DIR_ENV], GENERATED_DIR_ENV)
    if explicit is not None:
        return _explicit(
            entry, target, module, version, Path(explicit[0]).expanduser(), explicit[1], allow_version_mismatch
        )
    looked: List[str] = []
    if CHECKOUT is not None:
        path = CHECKOUT / "generated" / entry.spec_folder / f"{module}.py"
        found = _header_version(path)
        if found == version:
            return GeneratedLocation(module, path, "checkout", found)
        looked.append(f"{path} ({_why_not(path, found)})")
        if found is not None:
            logger.info(
                "opslot: not using %s: generated for transformers %s, transformers %s is installed",
                path,
                found,
                version,
            )
    return _from_cache(entry, target, module, version, source_root, looked)


def _why_not(path: Path, found: Optional[str]) -> str:
    if found is not None:
        return f"generated for transformers {found}"
    return "no patchgen header" if path.is_file() else "absent"


def _explicit(
    entry: GeneratedModel, target: str, module: str, version: str, folder: Path, label: str, allow: bool
) -> GeneratedLocation:
    where = f"{label}={str(folder)!r}" if label == GENERATED_DIR_ENV else f"generated_dir={str(folder)!r}"
    if not folder.is_dir():
        raise GeneratedModuleError(f"{where} is not a folder")
    candidates = [folder / entry.spec_folder / f"{module}.py", folder / f"{module}.py"]
    for path in candidates:
        if not path.is_file():
            continue
        found = _header_version(path)
        if found is None:
            raise GeneratedModuleError(
                f"{path} ({where}) carries no patchgen header of a transformers module: "
                f"it is not {module} generated by patchgen"
            )
        if found != version and found != "unknown" and not (allow or _env_allows()):
            raise GeneratedVersionError(
                f"{path} ({where}) was generated by patchgen for transformers {found}, but transformers {version} "
                f"is installed: regenerate it against the installed transformers (patchgen "
                f"specs/{entry.spec(target)}), or leave generated_dir and {GENERATED_DIR_ENV} unset so that opslot "
                f"generates one into its cache, or use it anyway with allow_version_mismatch=True or "
                f"{VERSION_ENV}=1"
            )
        return GeneratedLocation(module, path, label, found)
    raise GeneratedModuleError(
        f"{where} holds no {module}.py (looked for {candidates[0]} and {candidates[1]}): generate it there "
        f"(patchgen specs/{entry.spec(target)} with that folder as the output root), or leave generated_dir and "
        f"{GENERATED_DIR_ENV} unset so that opslot finds or generates it"
    )


# --- the cache ----------------------------------------------------------------------------------------------


def find_specs() -> Tuple[Optional[Path], List[str]]:
    """(the specs folder, the places looked): $OPSLOT_SPECS_DIR, the checkout's specs/, opslot/_specs."""
    env = os.environ.get(SPECS_DIR_ENV)
    if env:
        path = Path(env).expanduser()
        if not path.is_dir():
            raise GeneratedModuleError(f"{SPECS_DIR_ENV}={env!r} is not a folder")
        return path.resolve(), []
    looked = [f"${SPECS_DIR_ENV} unset"]
    for path in ([CHECKOUT / "specs"] if CHECKOUT is not None else []) + [BUNDLED_SPECS]:
        if path.is_dir():
            return path.resolve(), looked
        looked.append(f"no {path}")
    return None, looked


def _script_dirs() -> List[str]:
    """Where a pip-installed patchgen lands when PATH does not name it (a venv used without activating)."""
    return list(dict.fromkeys(d for d in (sysconfig.get_path("scripts"), os.path.join(sys.prefix, "bin")) if d))


def find_patchgen() -> Tuple[Optional[str], List[str]]:
    """(the patchgen binary, the places looked): $PATCHGEN, PATH, beside the interpreter (the patchgen
    wheel), the checkout's build/tools/patchgen/patchgen."""
    env = os.environ.get(PATCHGEN_ENV)
    if env:
        if os.path.isfile(env) and os.access(env, os.X_OK):
            return os.path.abspath(env), []
        raise GeneratedModuleError(f"{PATCHGEN_ENV}={env!r} is not an executable file")
    looked = [f"${PATCHGEN_ENV} unset"]
    found = shutil.which("patchgen")
    if found:
        return os.path.abspath(found), looked
    looked.append("not on PATH")
    places = [os.path.join(d, "patchgen") for d in _script_dirs()]
    if CHECKOUT is not None:
        places.append(str(CHECKOUT / "build" / "tools" / "patchgen" / "patchgen"))
    for path in places:
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path, looked
        looked.append(f"no {path}")
    return None, looked


def specs_digest(specs: Path) -> str:
    """sha256 over every file under the specs folder (path and bytes; dot-files and caches left out)."""
    h = hashlib.sha256()
    for dirpath, dirs, files in os.walk(specs):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "__pycache__")
        for name in sorted(files):
            if name.startswith(".") or name.endswith(".pyc"):
                continue
            path = Path(dirpath) / name
            data = path.read_bytes()
            rel = path.relative_to(specs).as_posix().encode()
            h.update(b"%d:%s%d:" % (len(rel), rel, len(data)))
            h.update(data)
    return h.hexdigest()


def _record_path(path: Path) -> Path:
    """What opslot records beside a module it generated: the specs digest it was generated from."""
    return path.with_name(f".{path.stem}.opslot.json")


def _recorded_digest(path: Path) -> Optional[str]:
    try:
        return json.loads(_record_path(path).read_text(encoding="utf-8")).get("specs_sha256")
    except (OSError, ValueError, AttributeError):
        return None


_THREAD_LOCK = threading.Lock()


@contextlib.contextmanager
def _generation_lock(folder: Path) -> Iterator[None]:
    """One generator per cache folder at a time: threads (a lock) and processes (flock on a file that
    is created once and never removed, so that every process locks the same file)."""
    folder.mkdir(parents=True, exist_ok=True)
    with _THREAD_LOCK:
        fd = os.open(folder / _LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)


def _write_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file of our own renamed over it (unchanged: untouched)."""
    try:
        if path.read_text(encoding="utf-8") == text:
            return
    except OSError:
        pass
    tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}.{threading.get_ident()}")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()  # only the temporary file this call created


def _from_cache(
    entry: GeneratedModel, target: str, module: str, version: str, source_root: Path, looked: List[str]
) -> GeneratedLocation:
    folder = cache_dir(version)
    path = folder / entry.spec_folder / f"{module}.py"
    location = GeneratedLocation(module, path, "cache", version)
    specs, specs_looked = find_specs()
    digest = specs_digest(specs) if specs is not None else None

    def fresh() -> bool:
        return _header_version(path) == version and (digest is None or _recorded_digest(path) == digest)

    if fresh():
        return location
    patchgen, patchgen_looked = find_patchgen()
    with _generation_lock(folder):
        if fresh():  # another process generated it meanwhile
            return location
        if specs is None or patchgen is None:
            if _header_version(path) == version:  # made from other specs, and nothing here regenerates it
                logger.warning(
                    "opslot: using %s, generated from other specs than %s (patchgen not found: %s)",
                    path,
                    specs,
                    "; ".join(patchgen_looked),
                )
                return location
            looked.append(f"{path} ({_why_not(path, _header_version(path))})")
            missing = (
                f"patchgen not found ({'; '.join(patchgen_looked)})"
                if patchgen is None
                else f"no patchgen specs found ({'; '.join(specs_looked)})"
            )
            fix = (
                "install patchgen (docs/adopting.md) or set PATCHGEN to its path"
                if patchgen is None
                else f"set {SPECS_DIR_ENV} to the patchgen specs folder (specs/ of the opslot repository)"
            )
            raise GeneratedModuleError(
                f"cannot generate {module} for the installed transformers {version}: {missing}. Fix: {fix}, or set "
                f"{GENERATED_DIR_ENV} to a folder of modules generated for transformers {version}. Looked for the "
                f"module at: {', '.join(looked)}"
            )
        _generate(entry, target, module, path, folder, specs, digest, patchgen, version, source_root)
    return location


def _generate(
    entry: GeneratedModel,
    target: str,
    module: str,
    path: Path,
    folder: Path,
    specs: Path,
    digest: Optional[str],
    patchgen: str,
    version: str,
    source_root: Path,
) -> None:
    """Run patchgen on the spec of `module` with `folder` as its project and output root."""
    spec = specs / entry.spec(target)
    if not spec.is_file():
        raise GeneratedModuleError(f"cannot generate {module}: the specs folder {specs} has no {entry.spec(target)}")
    _write_atomic(
        folder / _CONFIG_NAME,
        "# Written by opslot (docs/auto.md): the patchgen project of the generated-module cache.\n"
        f'specs = {json.dumps(str(specs))}\noutput = "."\n',
    )
    command = [patchgen, str(spec), "--source-root", str(source_root)]
    logger.info("opslot: generating %s for transformers %s: %s (in %s)", module, version, " ".join(command), folder)
    try:
        proc = subprocess.run(command, cwd=folder, capture_output=True, text=True, timeout=PATCHGEN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise GeneratedModuleError(
            f"patchgen did not finish generating {module} in {PATCHGEN_TIMEOUT_S} s: {' '.join(command)} (in {folder})"
        ) from None
    except OSError as exc:
        raise GeneratedModuleError(f"cannot run patchgen ({patchgen}): {exc}") from None
    if proc.returncode != 0:
        raise GeneratedModuleError(
            f"patchgen failed (exit {proc.returncode}) generating {module} for the installed transformers {version}: "
            f"{' '.join(command)} (in {folder})\n{proc.stderr.strip()}"
        )
    if proc.stderr.strip():
        logger.warning("opslot: patchgen, generating %s: %s", module, proc.stderr.strip())
    found = _header_version(path)
    if found != version:
        raise GeneratedModuleError(
            f"patchgen did not write {path} for transformers {version} (found: "
            f"{_why_not(path, found)}): {' '.join(command)} (in {folder})\n{proc.stdout.strip()}"
        )
    _write_atomic(
        _record_path(path),
        json.dumps(
            {
                "module": module,
                "spec": str(spec),
                "specs_sha256": digest,
                "transformers": version,
                "patchgen": patchgen,
            },
            indent=1,
        )
        + "\n",
    )
    importlib.invalidate_caches()


# --- import -------------------------------------------------------------------------------------------------

_IMPORT_LOCK = threading.RLock()


def _same_file(a: Any, b: Path) -> bool:
    try:
        return a is not None and os.path.samefile(a, b)
    except OSError:
        return False


def import_location(location: GeneratedLocation, allow_version_mismatch: bool = False) -> types.ModuleType:
    """Import the located module under its own name, its folder put first on sys.path (so that module
    copies, pickled models and spawned workers import it by name too). A module of that name already
    imported from another file is an error: one process, one file per module name."""
    with _IMPORT_LOCK:
        existing = sys.modules.get(location.module)
        if existing is not None:
            if not _same_file(getattr(existing, "__file__", None), location.path):
                raise GeneratedModuleError(
                    f"{location.module} is already imported from {getattr(existing, '__file__', None)}, but opslot "
                    f"found {location.path} ({location.source}) for this model: one process imports one file per "
                    f"module name; import the generated modules from one folder (generated_dir= or "
                    f"{GENERATED_DIR_ENV})"
                )
            check_module_upstream(existing, allow_version_mismatch)
            return existing
        folder = str(location.path.parent)
        if folder not in sys.path:
            sys.path.insert(0, folder)
        importlib.invalidate_caches()
        module = import_generated(location.module, allow_version_mismatch)
        if not _same_file(getattr(module, "__file__", None), location.path):
            del sys.modules[location.module]
            raise GeneratedModuleError(
                f"importing {location.module} found {getattr(module, '__file__', None)}, not {location.path} "
                f"({location.source}): a folder before {folder} on sys.path holds a module of that name"
            )
        return module


def generated_module(
    model_type: str,
    target: Optional[str] = None,
    *,
    device: Optional[DeviceInfo] = None,
    generated_dir: Union[str, os.PathLike, None] = None,
    allow_version_mismatch: bool = False,
) -> types.ModuleType:
    """The generated module of `model_type` for `target` (default: the device's), located (and
    generated) by `locate_generated`, imported."""
    location = locate_generated(
        model_type, target, device=device, generated_dir=generated_dir, allow_version_mismatch=allow_version_mismatch
    )
    return import_location(location, allow_version_mismatch)


# --- the auto classes -------------------------------------------------------------------------------------


def _for_class(model_class: type, config: Any) -> Any:
    """The config `model_class` is built from: the text sub-config when the class takes that (a
    multimodal model type's *ForCausalLM), as Transformers' auto classes do."""
    sub = getattr(config, "sub_configs", None)
    text_class = sub.get("text_config") if isinstance(sub, dict) else None
    if text_class is None or getattr(model_class, "config_class", None) != text_class:
        return config
    text = config.get_text_config()
    quant = getattr(config, "quantization_config", None)
    if quant is not None:
        text.quantization_config = quant
    return text


class _AutoGenerated:
    """Shared by the opslot auto classes; `role` is the registry role (opslot.models.ROLES)."""

    role = ""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError(
            f"opslot.{type(self).__name__} is not instantiated: use opslot.{type(self).__name__}."
            f"from_config(config, ops=...) or .from_pretrained(path, ops=...)"
        )

    @classmethod
    def resolve(
        cls,
        model_type: str,
        *,
        target: Optional[str] = None,
        device: Optional[DeviceInfo] = None,
        generated_dir: Union[str, os.PathLike, None] = None,
        allow_version_mismatch: bool = False,
    ) -> Tuple[types.ModuleType, str]:
        """(generated module, class name) for `model_type` on this device (or `target`)."""
        who = f"opslot.{cls.__name__}"
        entry = model_entry(model_type, who)
        class_name = entry.class_name(cls.role, who)
        module = generated_module(
            model_type,
            target,
            device=device,
            generated_dir=generated_dir,
            allow_version_mismatch=allow_version_mismatch,
        )
        return module, class_name

    @classmethod
    def from_config(
        cls,
        config: Any,
        ops: Any = None,
        *,
        target: Optional[str] = None,
        device: Optional[DeviceInfo] = None,
        generated_dir: Union[str, os.PathLike, None] = None,
        allow_version_mismatch: bool = False,
        **kwargs: Any,
    ) -> Any:
        """`opslot.build_model(config, ops, module=<generated module>, model_class=<class>)`: a fresh model
        with the kernels `ops` chooses bound. `kwargs` are build_model's (private_copy, registry,
        allow_unreached)."""
        _check_hf_config(config)
        module, class_name = cls.resolve(
            getattr(config, "model_type", None),
            target=target,
            device=device,
            generated_dir=generated_dir,
            allow_version_mismatch=allow_version_mismatch,
        )
        config = _for_class(getattr(module, class_name), config)
        return build_model(
            config,
            ops=ops,
            module=module,
            model_class=class_name,
            device=device,
            allow_version_mismatch=allow_version_mismatch,
            **kwargs,
        )

    @classmethod
    def from_pretrained(
        cls,
        pretrained_model_name_or_path: Any,
        ops: Any = None,
        *,
        config: Any = None,
        target: Optional[str] = None,
        device: Optional[DeviceInfo] = None,
        generated_dir: Union[str, os.PathLike, None] = None,
        allow_version_mismatch: bool = False,
        **kwargs: Any,
    ) -> Any:
        """`opslot.hf.from_pretrained(path, <generated module>, <class>, ops)`: kernels bound, weights
        loaded strictly (a partial load is `opslot.hf.PartialLoadError`; `strict=False` allows it).
        The model type comes from `config` or the checkpoint's config; `kwargs` are Transformers'
        `from_pretrained`'s (dtype, revision, ...) and build_model's (private_copy, registry, allow_unreached)."""
        if config is None:
            from transformers import AutoConfig

            hub = {k: kwargs[k] for k in hf._HUB_KWARGS if k in kwargs}
            config = AutoConfig.from_pretrained(pretrained_model_name_or_path, **hub)
        module, class_name = cls.resolve(
            getattr(config, "model_type", None),
            target=target,
            device=device,
            generated_dir=generated_dir,
            allow_version_mismatch=allow_version_mismatch,
        )
        config = _for_class(getattr(module, class_name), config)
        return hf.from_pretrained(
            pretrained_model_name_or_path,
            module,
            class_name,
            ops,
            config=config,
            device=device,
            allow_version_mismatch=allow_version_mismatch,
            **kwargs,
        )


class AutoModelForCausalLM(_AutoGenerated):
    """The generated class Transformers' AutoModelForCausalLM would build (role "causal_lm")."""

    role = "causal_lm"


class AutoModel(_AutoGenerated):
    """The generated base model (role "base")."""

    role = "base"


class AutoModelForImageTextToText(_AutoGenerated):
    """The generated *ForConditionalGeneration of a multimodal model type (role "conditional_generation")."""

    role = "conditional_generation"


assert {
    c.role: c.__name__ for c in (AutoModelForCausalLM, AutoModel, AutoModelForImageTextToText)
} == AUTO_CLASS_OF_ROLE
