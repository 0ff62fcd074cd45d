"""Checks that refuse to run something wrong: kernels a model's config rules out, and generated
modules generated for another release of their upstream package.

`MODEL_CHECKS[(op, variant)]` (variant None: every variant) is `fn(hf_config) -> reason or None`;
a reason refuses every kernel (anything but eager) for that slot on that model, at bind time, not at
the first forward. Plug-ins may add entries for their own ops.

The header of every generated module calls `opslot.checks.check_generated_upstream(__name__, ...)`
(patchgen writes that call: keep its name and place); opslot calls it too, through
`import_generated` and `check_module_upstream`, where it first uses a generated module.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import importlib.util
import os
import sys
import types
import warnings
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Tuple

from .copy_names import original_name
from .ops import EAGER, FIELD_FOR_OP

_SILU_NAMES = ("silu", "swish")


def configs_of(config: Any) -> List[Any]:
    """`config`, then its text config when it has a different one (multimodal models)."""
    out = [config]
    get_text = getattr(config, "get_text_config", None)
    if callable(get_text):
        try:
            text = get_text()
        except Exception:
            text = None
        if text is not None and text is not config:
            out.append(text)
    sub = getattr(config, "text_config", None)
    if sub is not None and all(sub is not c for c in out):
        out.append(sub)
    return out


def silu_refusal(config: Any) -> Optional[str]:
    """swiglu_mlp computes `down(silu(gate(x)) * up(x))`: refuse another activation."""
    for cfg in configs_of(config):
        for attr in ("hidden_act", "hidden_activation"):
            act = getattr(cfg, attr, None)
            if isinstance(act, str):
                return None if act in _SILU_NAMES else f"computes SiLU gating but the model's {attr} is {act!r}"
    return None


def softcapping_refusal(config: Any) -> Optional[str]:
    """cross_entropy_loss/causal kernels compute the loss of the plain lm_head logits."""
    for cfg in configs_of(config):
        cap = getattr(cfg, "final_logit_softcapping", None)
        if cap is not None:
            return f"does not apply the model's final_logit_softcapping ({cap})"
    return None


MODEL_CHECKS: Dict[Tuple[str, Optional[str]], Callable[[Any], Optional[str]]] = {
    ("swiglu_mlp", None): silu_refusal,
    ("cross_entropy_loss", "causal"): softcapping_refusal,
}


def model_refusal(op: str, variant: str, impl: str, hf_config: Any) -> Optional[str]:
    """Why `impl` cannot run `op`/`variant` on a model with `hf_config` (None: it can)."""
    if impl == EAGER or hf_config is None:
        return None
    check = MODEL_CHECKS.get((op, variant)) or MODEL_CHECKS.get((op, None))
    reason = check(hf_config) if check is not None else None
    if reason is None:
        return None
    field = FIELD_FOR_OP.get(op, f"{op}_implementation")
    return f"{op}/{variant} kernel {impl!r} {reason}; set {field}: eager for this model"


def check_kernels_for_model(pairs: Iterable[Tuple[str, str, str]], hf_config: Any) -> None:
    """Raise ValueError listing every (op, variant, impl) the model refuses."""
    problems = sorted({r for op, variant, impl in pairs if (r := model_refusal(op, variant, impl, hf_config))})
    if problems:
        raise ValueError("the model refuses these kernels:\n" + "\n".join(f"  {p}" for p in problems))


# --- Generated for another release of the upstream package (docs/runtime.md) -----------------------

#: `OPSLOT_ALLOW_VERSION_MISMATCH=1` uses a module generated for another release anyway (a warning).
VERSION_ENV = "OPSLOT_ALLOW_VERSION_MISMATCH"
#: The module-level constant patchgen's header defines: ("<package>", "<version>").
STAMP = "__patchgen_upstream__"
_ALLOW_MISMATCH: contextvars.ContextVar[bool] = contextvars.ContextVar("opslot_allow_version_mismatch", default=False)
_WARNED: set = set()


class GeneratedVersionError(ImportError):
    """A generated module was generated from another release of its upstream package (e.g.
    transformers) than the one installed. An ImportError: it is raised while the module is imported."""


class GeneratedVersionWarning(UserWarning):
    """The same mismatch, allowed by `allow_version_mismatch=True` or $OPSLOT_ALLOW_VERSION_MISMATCH."""


def _env_allows() -> bool:
    text = os.environ.get(VERSION_ENV, "").strip().lower()
    if text in ("", "0", "false", "no"):
        return False
    if text in ("1", "true", "yes"):
        return True
    raise ValueError(
        f"{VERSION_ENV}={os.environ[VERSION_ENV]!r}: set it to 1 to allow a generated module of "
        f"another release, or 0 (or unset it)"
    )


@contextlib.contextmanager
def allowing_version_mismatch(allow: bool) -> Iterator[None]:
    """While the block runs (in this thread/context), generated modules imported or loaded, stamp
    checks included, accept another upstream release when `allow` is true."""
    token = _ALLOW_MISMATCH.set(bool(allow) or _ALLOW_MISMATCH.get())
    try:
        yield
    finally:
        _ALLOW_MISMATCH.reset(token)


def read_header(path: Any) -> Optional[Dict[str, str]]:
    """The fields of the patchgen header at the top of the file `path` ({"spec", "upstream", "version"},
    "package" = the upstream's first component), or None when the file carries no such header."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            head = [f.readline() for _ in range(2)]
            if not (head[0].startswith("# ====") and head[1].startswith("# GENERATED by patchgen")):
                return None
            fields: Dict[str, str] = {}
            for line in f:
                if not line.startswith("#") or line.startswith("# ===="):
                    break
                key, sep, value = line[1:].strip().partition(":")
                if sep and key in ("spec", "upstream", "version") and key not in fields:
                    fields[key] = value.strip()
    except OSError:
        return None
    if "upstream" not in fields or "version" not in fields:
        return None
    fields["package"] = fields["upstream"].split(".", 1)[0].split(" ", 1)[0]
    return fields


def generated_upstream(module: types.ModuleType) -> Optional[Tuple[str, str]]:
    """(package, version) a generated module was generated from: its `__patchgen_upstream__`, else
    (modules that start with a docstring carry no code stamp) its file's header; None for others."""
    stamp = getattr(module, STAMP, None)
    if isinstance(stamp, tuple) and len(stamp) == 2 and all(isinstance(x, str) for x in stamp):
        return stamp
    path = getattr(module, "__file__", None)
    header = read_header(path) if path else None
    return (header["package"], header["version"]) if header else None


def _installed_version(package: str) -> Optional[str]:
    mod = sys.modules.get(package)
    if mod is None:
        try:
            mod = importlib.import_module(package)
        except Exception:  # not importable: the module's own import says so
            return None
    version = getattr(mod, "__version__", None)
    return version if isinstance(version, str) else None


def version_mismatch_message(name: str, package: str, generated: str, installed: str, spec: Optional[str]) -> str:
    how = f"patchgen {spec}" if spec else "patchgen on its spec"
    return (
        f"{name} was generated by patchgen for {package} {generated}, but {package} {installed} is "
        f"installed: regenerate it against the installed {package} ({how}), or use it anyway with "
        f"allow_version_mismatch=True or {VERSION_ENV}=1"
    )


def check_generated_upstream(
    name: str, upstream: Tuple[str, str], *, allow: bool = False, spec: Optional[str] = None
) -> None:
    """Refuse (GeneratedVersionError) the generated module `name`, generated from `upstream` =
    (package, version), when another release of the package is installed, unless allowed (`allow`,
    `allowing_version_mismatch`, $OPSLOT_ALLOW_VERSION_MISMATCH): then one warning per mismatch.
    Called by the stamp in the module's header before upstream's imports run, and by opslot where a
    generated module is first used. Nothing to check for an unknown version or a package that cannot
    be imported or has no `__version__`."""
    package, version = upstream
    if not version or version == "unknown":
        return
    installed = _installed_version(package)
    if installed is None or installed == version:
        return
    if spec is None:
        path = getattr(sys.modules.get(name), "__file__", None)
        header = read_header(path) if path else None
        spec = header.get("spec") if header else None
    message = version_mismatch_message(original_name(name), package, version, installed, spec)
    if allow or _ALLOW_MISMATCH.get() or _env_allows():
        key = (package, version, installed)
        if key not in _WARNED:
            _WARNED.add(key)
            warnings.warn(
                message.split(": regenerate", 1)[0] + ": allowed, upstream code may not match",
                GeneratedVersionWarning,
                stacklevel=2,
            )
        return
    raise GeneratedVersionError(message)


def check_module_upstream(module: types.ModuleType, allow: bool = False) -> None:
    """check_generated_upstream for an imported module (its stamp, else its header)."""
    upstream = generated_upstream(module)
    if upstream is not None:
        check_generated_upstream(module.__name__, upstream, allow=allow)


def import_generated(name: str, allow: bool = False) -> types.ModuleType:
    """`importlib.import_module(name)`, refusing first, from the file's header and before anything of
    it runs, a module generated for another upstream release (so that the error is this one, not an
    ImportError of an upstream name that release lacks)."""
    if name not in sys.modules:
        try:
            found = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            found = None
        origin = getattr(found, "origin", None)
        header = read_header(origin) if origin and origin.endswith(".py") else None
        if header:
            check_generated_upstream(name, (header["package"], header["version"]), allow=allow, spec=header.get("spec"))
    with allowing_version_mismatch(allow):
        module = importlib.import_module(name)
    check_module_upstream(module, allow)
    return module
