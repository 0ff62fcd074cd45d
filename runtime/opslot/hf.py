"""Transformers integration: generated models load and save checkpoints exactly as upstream does.

Transformers converts checkpoints on the fly (per-expert MoE weights <-> the fused `gate_up_proj` /
`down_proj`, renamed prefixes, ...) through its checkpoint conversion mapping, but skips that mapping
for classes it takes for custom code: `PreTrainedModel.is_custom_code()` is true for every class
whose module is not under `transformers.`, which includes every patchgen-generated module. A
generated MoE model then loads a Hub checkpoint with UNEXPECTED per-expert keys, MISSING fused
experts initialised at random, and only a log line says so.

The real-model specs therefore give each generated `*PreTrainedModel` two methods:

- `is_custom_code()` returns `cls.is_remote_code()`, which is what Transformers computes for its own
  classes: the generated code *is* Transformers' code, patched, so it gets the same conversion
  mapping on load and its reverse on save (`save_pretrained` writes what upstream writes), and the
  same weight initialisation path;
- `from_pretrained(...)` goes through `strict_from_pretrained` below: a checkpoint that would load
  partially (missing, unexpected or shape-mismatched keys) raises `PartialLoadError` naming the keys,
  instead of logging a report and initialising the rest at random. `strict=False` restores the
  Transformers behaviour; `ignore_mismatched_sizes=True` still allows re-initialised mismatched keys.

This module also has the user-facing entry points: `from_pretrained(path, module, ops=...)` (a
generated model with its kernels bound, weights from a checkpoint) and `register_auto_classes(module)`
(`AutoModelForCausalLM` & co. produce the generated classes). Transformers is imported lazily.
"""

from __future__ import annotations

import importlib
import logging
import re
import types
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple, Union

from .binding import EXPERTS_EAGER, build_model, carry_dispatch
from .checks import check_module_upstream, import_generated
from .copies import LOCK
from .dispatch import watch_dispatch
from .hardware import DeviceInfo
from .plan import binding_plan
from .registry import KernelRegistry
from .saved_choice import check_slots_follow, saved_ops
from .slot import slots_of_class

#: Keyword arguments of `from_pretrained` that locate files (passed to AutoConfig as well).
_HUB_KWARGS = (
    "cache_dir",
    "force_download",
    "local_files_only",
    "proxies",
    "revision",
    "subfolder",
    "token",
    "trust_remote_code",
    "_commit_hash",
)
#: How many keys of each kind a PartialLoadError message lists before summarising.
_MAX_KEYS_LISTED = 50


class PartialLoadError(RuntimeError):
    """A checkpoint would load only partially into a generated model. `missing`, `unexpected` and
    `mismatched` hold the keys (sorted; mismatched as (key, checkpoint shape, model shape))."""

    def __init__(
        self,
        model_name: str,
        source: Any,
        missing: Iterable[str],
        unexpected: Iterable[str],
        mismatched: Iterable[Tuple[str, Any, Any]] = (),
    ) -> None:
        self.missing: List[str] = sorted(missing)
        self.unexpected: List[str] = sorted(unexpected)
        self.mismatched: List[Tuple[str, Any, Any]] = sorted(mismatched, key=lambda m: m[0])
        lines = [f"{model_name}.from_pretrained({str(source)!r}) would load only part of the weights:"]
        for title, keys in (
            ("missing from the checkpoint (would be initialised at random)", self.missing),
            ("unexpected (in the checkpoint, not in the model)", self.unexpected),
            ("shape mismatch (checkpoint vs model)", [f"{k}: {tuple(a)} vs {tuple(b)}" for k, a, b in self.mismatched]),
        ):
            if keys:
                lines.append(f"  {len(keys)} {title}:")
                lines += [f"    {k}" for k in keys[:_MAX_KEYS_LISTED]]
                if len(keys) > _MAX_KEYS_LISTED:
                    lines.append(f"    ... and {len(keys) - _MAX_KEYS_LISTED} more")
        lines.append("Pass strict=False to accept a partial load (Transformers' default: a logged report).")
        super().__init__("\n".join(lines))


def check_loading_info(
    model: Any, info: Dict[str, Any], source: Any = None, ignore_mismatched_sizes: bool = False
) -> None:
    """Raise PartialLoadError when `info` (what `from_pretrained(..., output_loading_info=True)`
    returns) reports missing or unexpected keys, or mismatched ones not explicitly allowed."""
    missing = set(info.get("missing_keys") or ())
    unexpected = set(info.get("unexpected_keys") or ())
    mismatched = set() if ignore_mismatched_sizes else set(info.get("mismatched_keys") or ())
    if missing or unexpected or mismatched:
        raise PartialLoadError(type(model).__name__, source, missing, unexpected, mismatched)


class _LoadReportCapture(logging.Handler):
    """Collects the LOAD REPORT that Transformers logs while loading (it names the keys; the
    RuntimeError it raises for conversion errors or size mismatches only points at the log)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.reports: List[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "LOAD REPORT" in message:
            self.reports.append(_ANSI.sub("", message))


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def strict_from_pretrained(load: Callable[..., Any], *args: Any, strict: bool = True, **kwargs: Any) -> Any:
    """`load(*args, **kwargs)` (a bound `PreTrainedModel.from_pretrained`), then, when `strict`,
    raise PartialLoadError if the checkpoint did not cover the model exactly. Returns what `load`
    returns (the model, or `(model, loading_info)` with `output_loading_info=True`). When
    Transformers itself refuses the checkpoint (a conversion error, a size mismatch), its
    RuntimeError is re-raised with the load report, which names the keys, in the message. A loaded
    model whose saved ops_implementation its module-level slots do not follow is refused; one whose
    moe slots run a kernel gets the eager experts dispatch that reaches them (`reach_moe_kernels`)."""
    want_info = kwargs.pop("output_loading_info", False)
    capture = _LoadReportCapture()
    hf_logger = logging.getLogger("transformers.modeling_utils")
    hf_logger.addHandler(capture)
    try:
        model, info = load(*args, output_loading_info=True, **kwargs)
    except RuntimeError as exc:
        if not capture.reports:
            raise
        raise RuntimeError(f"{exc}\n" + "\n".join(capture.reports)) from exc
    finally:
        hf_logger.removeHandler(capture)
    if strict:
        source = args[0] if args else kwargs.get("pretrained_model_name_or_path")
        check_loading_info(model, info, source, ignore_mismatched_sizes=kwargs.get("ignore_mismatched_sizes", False))
    _check_follows_saved_ops(model)  # a saved ops_implementation the module-level slots ignore: error
    reach_moe_kernels(model, kwargs.get("experts_implementation"))
    return (model, info) if want_info else model


def _check_follows_saved_ops(model: Any) -> None:
    """Refuse a loaded model (e.g. `generated.Class.from_pretrained(dir)` of a checkpoint saved with
    ops_implementation) whose module-level slots do not run what its `config.ops_implementation`
    chooses (opslot.saved_choice); nothing to check when the config carries none."""
    ops = saved_ops(getattr(model, "config", None))
    named = getattr(model, "named_modules", None)
    if ops is None or not callable(named):
        return
    seen = set()
    for _, sub in named():
        cls = type(sub)
        if cls.__module__ not in seen:
            seen.add(cls.__module__)
            check_slots_follow(ops, slots_of_class(cls), cls.__module__)


def reach_moe_kernels(model: Any, explicit: Optional[str] = None) -> None:
    """Give a loaded model whose moe slots run a kernel Transformers' eager experts dispatch (where
    the moe guard sits), as build_model gives the models it builds, and write it where the config
    saves it (`carry_dispatch`): a checkpoint whose config.json lacks it (saved by a model that was
    itself loaded) would otherwise dispatch to Transformers' default and never reach the kernel. An
    explicit `experts_implementation=` of the caller wins."""
    config = getattr(model, "config", None)
    if explicit is not None or config is None or not hasattr(config, "_experts_implementation"):
        return
    if not any(e.op == "moe" and e.impl != EXPERTS_EAGER for e in binding_plan(model)):
        return
    if config._experts_implementation != EXPERTS_EAGER and callable(getattr(model, "set_experts_implementation", None)):
        model.set_experts_implementation(EXPERTS_EAGER)
    carry_dispatch(config, "experts_implementation", EXPERTS_EAGER)


def _module_of(module: Union[str, types.ModuleType]) -> types.ModuleType:
    return importlib.import_module(module) if isinstance(module, str) else module


def from_pretrained(
    pretrained_model_name_or_path: Any,
    module: Union[str, types.ModuleType],
    model_class: Union[str, type, None] = None,
    ops: Any = None,
    *,
    private_copy: bool = True,
    registry: Optional[KernelRegistry] = None,
    device: Optional[DeviceInfo] = None,
    allow_unreached: Union[bool, Iterable[str]] = False,
    allow_version_mismatch: bool = False,
    **kwargs: Any,
) -> Any:
    """A generated model with kernels chosen by `ops`, weights from a checkpoint.

    What `opslot.build_model` does for a fresh model (private copy of `module` with its module-level
    slots bound, `config.ops_implementation` for instance-scoped ones, `attn_implementation`), then
    `model_class.from_pretrained(path, config=..., **kwargs)` of that copy: strict (see the module
    docstring), Transformers' conversion mapping applied. `model_class` defaults to the checkpoint's
    `config.architectures[0]`. `kwargs` are `from_pretrained`'s (dtype, attn_implementation,
    experts_implementation, revision, strict, ...). The model is watched for proof of dispatch, as
    build_model's (`allow_unreached` likewise); `allow_version_mismatch` is build_model's."""
    import torch
    from transformers import AutoConfig

    if isinstance(module, str):  # refused before it is imported when generated for another release
        module = import_generated(module, allow_version_mismatch)
    check_module_upstream(module, allow_version_mismatch)
    config = kwargs.pop("config", None)
    if config is None:
        hub = {k: kwargs[k] for k in _HUB_KWARGS if k in kwargs}
        config = AutoConfig.from_pretrained(pretrained_model_name_or_path, **hub)
    if model_class is None:
        archs = getattr(config, "architectures", None) or []
        if not archs:
            raise ValueError(f"the config of {pretrained_model_name_or_path!r} names no architecture: pass model_class")
        model_class = archs[0]
    # The class, bound module copy and config that build_model would use, without allocating weights.
    with torch.device("meta"):
        shell = build_model(
            config,
            ops=ops,
            module=module,
            model_class=model_class,
            private_copy=private_copy,
            registry=registry,
            device=device,
            allow_version_mismatch=allow_version_mismatch,
        )
    cls, config = type(shell), shell.config  # shell (a user of the copy) lives until the model is attached
    chosen_attn = (getattr(config, "ops_implementation", None) or {}).get("attn_implementation")
    attn = kwargs.get("attn_implementation")
    if attn is not None and chosen_attn is not None and attn != chosen_attn:
        raise ValueError(f"attn_implementation={attn!r} contradicts the ops config's {chosen_attn!r}")
    loaded = cls.from_pretrained(pretrained_model_name_or_path, config=config, **kwargs)
    model = loaded[0] if isinstance(loaded, tuple) else loaded
    with LOCK:
        for slot in slots_of_class(cls).values():
            slot.attach(model)
    watch_dispatch(model, allow_unreached=allow_unreached)
    del shell
    return loaded


class AutoRegistration:
    """What `register_auto_classes` registered: `classes` = {auto class name: {config class name:
    generated class}}. `unregister()` (or leaving the `with` block) restores the previous mapping."""

    def __init__(self) -> None:
        self.classes: Dict[str, Dict[str, type]] = {}
        self._undo: List[Tuple[Any, type, Any]] = []  # (auto mapping, config class, previous extra or _NONE)

    def unregister(self) -> None:
        for mapping, config_class, previous in reversed(self._undo):
            if previous is _NONE:
                mapping._extra_content.pop(config_class, None)
            else:
                mapping._extra_content[config_class] = previous
        self._undo.clear()
        self.classes.clear()

    def __enter__(self) -> "AutoRegistration":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.unregister()

    def __repr__(self) -> str:
        return f"AutoRegistration({ {a: {c: k.__name__ for c, k in m.items()} for a, m in self.classes.items()} })"


_NONE = object()


def _auto_model_classes() -> List[type]:
    from transformers.models.auto import modeling_auto
    from transformers.models.auto.auto_factory import _BaseAutoModelClass

    found = []
    for name in sorted(dir(modeling_auto)):
        obj = getattr(modeling_auto, name)
        if (
            isinstance(obj, type)
            and issubclass(obj, _BaseAutoModelClass)
            and name.startswith("AutoModel")
            and getattr(obj, "_model_mapping", None) is not None
        ):
            found.append(obj)
    return found


def register_auto_classes(
    module: Union[str, types.ModuleType], auto_classes: Optional[Iterable[type]] = None
) -> AutoRegistration:
    """Make the Transformers auto classes (`AutoModelForCausalLM`, `AutoModel`, ... or those given)
    produce the classes of the generated `module` wherever upstream would produce the class of the
    same name for the same config class. Returns an `AutoRegistration` (usable as a context manager).

    Registers with `auto.register(config_class, cls, exist_ok=True)`. Transformers before 5.23
    silently ignores that for its own config classes (remote code must not hijack them), and
    generated classes use upstream's configs: there the registration is written where `register`
    would write it (the mapping's extra content). Either way it is checked to take effect; leaving
    restores the previous entries. Kernels: bind `module` first
    (`opslot.load_private_copy` + `opslot.bind_ops`); instance-scoped slots read
    `config.ops_implementation`, which `from_pretrained(..., config=...)` can carry."""
    from transformers import PreTrainedModel

    module = _module_of(module)
    generated = {
        name: obj
        for name, obj in vars(module).items()
        if isinstance(obj, type)
        and issubclass(obj, PreTrainedModel)
        and obj.__module__ == module.__name__
        and isinstance(getattr(obj, "config_class", None), type)
    }
    reg = AutoRegistration()
    for auto in list(auto_classes) if auto_classes is not None else _auto_model_classes():
        mapping = auto._model_mapping
        for cls in generated.values():
            config_class = cls.config_class
            try:
                current = mapping[config_class]
            except KeyError:
                continue
            if isinstance(current, (list, tuple)) or getattr(current, "__name__", None) != cls.__name__:
                continue
            previous = mapping._extra_content.get(config_class, _NONE)
            reg._undo.append((mapping, config_class, previous))
            auto.register(config_class, cls, exist_ok=True)
            if mapping[config_class] is not cls:  # Transformers < 5.23 skips native configs
                mapping._extra_content[config_class] = cls
            if mapping[config_class] is not cls:
                reg.unregister()
                raise RuntimeError(
                    f"could not register {cls.__name__} for {auto.__name__}: this Transformers "
                    f"version resolves auto classes differently"
                )
            reg.classes.setdefault(auto.__name__, {})[config_class.__name__] = cls
    if not reg.classes:
        raise ValueError(f"module {module.__name__!r} has no class that a Transformers auto class produces")
    return reg
