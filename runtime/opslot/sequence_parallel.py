"""Sequence parallelism (DeepSpeed-Ulysses) for generated text models, on a DeviceMesh dimension `sp`.

    import opslot.distributed as od
    par = od.parallelize(model, sp=2)                   # mesh (dp, sp); FSDP2 over every rank
    batch = od.shard_batch(global_batch, par.sp)         # this rank's slice of the sequence
    out = model(**batch)                                 # out.loss: the loss of the whole sequence
    out.loss.backward()

Every rank of an SP group holds a contiguous slice of every row of the batch (the global sequence is
the ranks' slices in rank order). Everything that works on tokens one at a time (embeddings, norms,
MLPs, MoE experts, the LM head and the loss) runs on the local slice; what mixes tokens runs head-
parallel on the whole sequence:

- attention: `opslot_sp`, an attention implementation registered with Transformers'
  AttentionInterface, wraps the one the model had (sdpa, eager, opslot_varlen). Before it, one
  all-to-all of q, of k and of v turns [B, H, s, D] (every head, this rank's tokens) into
  [B, H/sp, S, D] (H/sp heads, every token); after it, one all-to-all brings the output back. The
  inner implementation gets masks of the gathered sequence, built here once per forward: causal over
  S, documents of a packed row from the GLOBAL position ids, the gathered padding mask, sliding
  windows. KV heads fewer than the SP ranks are replicated (sp % kv_heads == 0).
- Gated DeltaNet (Qwen3.5): the bound kernels of its `causal_conv1d` and `chunk_gated_delta_rule`
  slots are wrapped: the conv gets [B, C/sp, S] (a block of the q|k|v channels over the whole
  sequence: the conv is depthwise, so any channel block is exact) and the delta rule H/sp heads of
  q, k, v, g, beta over the whole sequence; each exchange is undone after the kernel. The wrappers
  act only on calls that carry this forward's context (the `opslot_sp` keyword the layers pass on to
  the kernels), so other models sharing the slot are untouched.

Per forward (`SequenceParallel*ForCausalLM.forward`): the ranks agree on the batch shape and the
inputs given (one all_gather of a few host integers: a rank whose input differs makes the same
ValueError on every rank, before any exchange), then one all_gather of the integer inputs
(position ids, labels, padding mask) gives every rank the global ones: RoPE reads the local slice
of the global positions; documents (packed rows) and masks come from the global tensors; the labels
are shifted on the global sequence (`shift_labels`: a slice's last token predicts the next rank's
first) and the number of targets of the whole sequence is counted there. The local loss is the sum
over local targets divided by that number (`num_items_in_batch`, any cross-entropy kernel), and the
returned loss is its all-reduced sum: the loss of the unsharded sequence on every rank. MoE: the
router logits are gathered (global order) and the load-balancing loss computed once on them with the
gathered padding mask, so it uses the global token statistics; `router_logits` in the output are the
gathered ones.

Gradients. The reductions here (the loss's all-reduce, the router logits' all-gather) are
differentiable with their exact adjoints (all-reduce, reduce-scatter), so on every rank
`loss.backward()` computes that rank's share of the gradient of sp x the loss: averaged over the SP
ranks (and the data-parallel ones) the gradients are exactly those of the unsharded loss. FSDP2 over
every rank (what `parallelize` does) and DDP average them; without either, call `average_gradients`.
"""

from __future__ import annotations

import hashlib
import inspect
import sys
from typing import Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Tuple

import torch
import torch.distributed as dist
from torch import Tensor, nn

from .collectives import _all_to_all, _gather_ints, _group_of, all_to_all, forward_subclass
from .expert_parallel import fully_shard_model, init_meshes, shard_experts
from .slot import OpSlot

#: The attention implementation name under which the SP wrapper is registered.
SP_ATTENTION = "opslot_sp"
#: The keyword that carries a forward's SequenceParallelContext to the attention and token-mixer kernels.
CTX_KEY = "opslot_sp"
#: Inner attention implementations the wrapper gives the gathered sequence to.
INNER_ATTENTION = ("sdpa", "eager", "opslot_varlen")
_GDN_OPS = ("causal_conv1d", "chunk_gated_delta_rule")
#: Keywords of one local forward that the inner attention must not see (they describe the local slice).
_LOCAL_KEYS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k", "position_ids")
#: torch < 2.5: sdpa returns NaN for a query whose keys are all masked (since 2.5: zeros).
_OLD_SDPA = tuple(
    int("".join(c for c in v if c.isdigit()) or 0) for v in torch.__version__.split("+")[0].split(".")[:2]
) < (2, 5)
#: Inputs whose tensors travel along the sequence (second dimension).
_SEQ_INPUTS = ("input_ids", "labels", "shift_labels", "attention_mask", "position_ids", "inputs_embeds")


# -- differentiable collectives -----------------------------------------------------------------------
def _exchange(x: Tensor, size: int, group: Any, split: int, cat: int) -> Tensor:
    """All-to-all that splits `x` into `size` blocks along `split` (block j to rank j) and concatenates
    the blocks received along `cat`, in rank order. Differentiable (the backward is the reverse)."""
    shape = list(x.shape)
    if shape[split] % size:
        raise ValueError(
            f"sequence parallelism: dimension {split} of {tuple(x.shape)} does not split over {size} ranks"
        )
    blocks = x.reshape(shape[:split] + [size, shape[split] // size] + shape[split + 1 :]).movedim(split, 0)
    got = all_to_all(blocks.contiguous(), None, None, group)  # [size (source rank), ...]
    got = got.movedim(0, cat)
    merged = list(got.shape)
    return got.reshape(merged[:cat] + [merged[cat] * merged[cat + 1]] + merged[cat + 2 :])


class _AllReduceSum(torch.autograd.Function):
    """Sum over the group; backward: the sum of the gradients (every rank's copy is a term of the objective)."""

    @staticmethod
    def forward(ctx, x: Tensor, group) -> Tensor:
        ctx.group = group
        y = x.clone()
        dist.all_reduce(y, group=group)
        return y

    @staticmethod
    def backward(ctx, grad: Tensor):
        grad = grad.clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _AllGather(torch.autograd.Function):
    """[size, *x.shape]: every rank's x; backward: reduce-scatter of the gradients (an all-to-all and a sum)."""

    @staticmethod
    def forward(ctx, x: Tensor, group, size: int) -> Tensor:
        ctx.group = group
        parts = [torch.empty_like(x) for _ in range(size)]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.stack(parts)

    @staticmethod
    def backward(ctx, grad: Tensor):
        return _all_to_all(grad.contiguous(), None, None, ctx.group).sum(0), None, None


def all_reduce_sum(x: Tensor, group: Any) -> Tensor:
    """Differentiable sum over `group` (a process group or a 1-D mesh)."""
    return _AllReduceSum.apply(x, _group_of(group))


def average_gradients(model: nn.Module, group: Any) -> None:
    """Average every parameter's gradient over `group` (the SP group, or every rank with plain data
    parallelism): what FSDP2 or DDP over those ranks does. For a sequence-parallel model trained
    without either."""
    g = _group_of(group)
    size = dist.get_world_size(g)
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, group=g)
            p.grad.div_(size)


# -- state ---------------------------------------------------------------------------------------------
class SPState(NamedTuple):
    group: Any
    size: int
    rank: int
    base: type  # the model's class before sequence parallelism
    params: Tuple[str, ...]  # names of the base forward's parameters, in order (positional binding)
    inner: str  # the attention implementation the wrapper calls
    eager_fns: Dict[type, Callable]  # attention class -> its module's eager_attention_forward
    kv_rep: int  # replication of KV heads (1: none)
    gdn_slots: Tuple[OpSlot, ...]  # token-mixer slots whose kernels are wrapped
    lb_func: Optional[Callable]  # the model module's load_balancing_loss_func (MoE), else None
    aux_attr: Optional[str]  # the attribute holding the aux-loss coefficient


class _HeadView:
    """The attention module as the inner implementation must see it after KV replication: the same
    module with `num_key_value_groups` of the local heads."""

    def __init__(self, module: nn.Module, groups: int) -> None:
        object.__setattr__(self, "_module", module)
        object.__setattr__(self, "num_key_value_groups", groups)

    def __getattr__(self, name: str) -> Any:
        return getattr(object.__getattribute__(self, "_module"), name)


class SequenceParallelContext:
    """What one forward's layers need of the global sequence (passed to them as the `opslot_sp` keyword)."""

    def __init__(
        self,
        state: SPState,
        batch: int,
        local: int,
        positions: Tensor,
        packed: bool,
        cu: Optional[Tensor],
        longest: int,
        key_mask: Optional[Tensor],
        mask: Optional[Tensor],
    ) -> None:
        self.state = state
        self.batch, self.local, self.total = batch, local, local * state.size
        self.positions = positions  # [B, S] global position ids
        self.packed = packed
        self.cu = cu  # int32 document offsets over the flattened rows (packed rows), else None
        self.longest = longest
        self.key_mask = key_mask  # bool [B, S]: padding the attention must mask (None: none, or trailing only)
        self.mask = mask  # [B, S] the gathered padding mask as given (None when none was given)
        self._masks: Dict[Any, Tensor] = {}
        self._docs: Optional[Tensor] = None

    def __repr__(self) -> str:  # kwargs are sometimes logged
        return f"SequenceParallelContext(sp={self.state.size}, batch={self.batch}, tokens={self.total})"

    def _allowed(self, window: Optional[int], device: torch.device) -> Tensor:
        key = ("allowed", window, device)
        got = self._masks.get(key)
        if got is None:
            i = torch.arange(self.total, device=device)
            allowed = i[None, :] <= i[:, None]
            if window is not None:
                allowed = allowed & ((i[:, None] - i[None, :]) < window)
            allowed = allowed[None]
            if self.packed:
                if self._docs is None:
                    starts = torch.ones_like(self.positions, dtype=torch.bool)
                    starts[:, 1:] = self.positions[:, 1:] != self.positions[:, :-1] + 1
                    self._docs = starts.long().cumsum(1)
                docs = self._docs.to(device)
                allowed = allowed & (docs[:, :, None] == docs[:, None, :])
            if self.key_mask is not None:
                allowed = allowed & self.key_mask.to(device)[:, None, :]
            got = self._masks[key] = allowed[:, None]
        return got

    def attention_inputs(
        self, window: Optional[int], dtype: torch.dtype, device: torch.device
    ) -> Tuple[Optional[Tensor], Dict[str, Any]]:
        """(attention_mask, extra keywords) of the gathered sequence for the inner implementation."""
        inner = self.state.inner
        if inner == "opslot_varlen":
            extra: Dict[str, Any] = {"position_ids": self.positions}
            if self.key_mask is not None:
                return self.key_mask, extra
            cu = self.cu
            longest = self.longest
            if cu is None:
                cu = torch.arange(self.batch + 1, device=device, dtype=torch.int32) * self.total
                longest = self.total
            extra.update(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=longest, max_length_k=longest)
            return None, extra
        if inner == "sdpa":
            if not self.packed and self.key_mask is None and window is None:
                return None, {}  # causal over the gathered sequence: sdpa's is_causal
            allowed = self._allowed(window, device)
            if _OLD_SDPA:  # a query that sees nothing sees every key (NaN otherwise), as Transformers' sdpa_mask
                allowed = allowed | ~allowed.any(-1, keepdim=True)
            return allowed, {}
        # eager: a query that sees nothing gets a uniform softmax over every key, as with Transformers' masks
        key = ("additive", window, dtype, device)
        got = self._masks.get(key)
        if got is None:
            allowed = self._allowed(window, device)
            got = self._masks[key] = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill(
                ~allowed, torch.finfo(dtype).min
            )
        return got, {}


# -- attention ---------------------------------------------------------------------------------------
def _no_context(what: str) -> RuntimeError:
    return RuntimeError(
        f"{what} ran without a sequence-parallel context: a model made sequence-parallel "
        f"(opslot.distributed.sequence_parallel / parallelize) must be called through its "
        f"top-level forward, with every rank of its SP group"
    )


@torch.compiler.disable
def sp_attention_forward(
    module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Optional[Tensor], **kwargs: Any
) -> Tuple[Tensor, None]:
    """Transformers' attention-interface signature. query [B, H, s, D], key/value [B, Hkv, s, D(v)] of
    this rank's tokens -> [B, s, H, Dv]: all-to-all to H/sp heads of every token, the inner
    implementation over the gathered sequence, all-to-all back."""
    ctx: Optional[SequenceParallelContext] = kwargs.pop(CTX_KEY, None)
    if ctx is None:
        raise _no_context(f"attention '{SP_ATTENTION}' of {type(module).__name__}")
    st = ctx.state
    size, group = st.size, st.group
    if st.kv_rep > 1:
        key = key.repeat_interleave(st.kv_rep, dim=1)
        value = value.repeat_interleave(st.kv_rep, dim=1)
    q = _exchange(query, size, group, split=1, cat=2)
    k = _exchange(key, size, group, split=1, cat=2)
    v = _exchange(value, size, group, split=1, cat=2)
    view: Any = module if st.kv_rep == 1 else _HeadView(module, q.shape[1] // k.shape[1])
    window = kwargs.get("sliding_window")
    mask, extra = ctx.attention_inputs(window, q.dtype, q.device)
    inner_kwargs = {k2: v2 for k2, v2 in kwargs.items() if k2 not in _LOCAL_KEYS}
    inner_kwargs.update(extra)
    if st.inner == "eager":
        fn = st.eager_fns[type(module)]
    else:
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        fn = ALL_ATTENTION_FUNCTIONS[st.inner]
    out, _ = fn(view, q, k, v, mask, **inner_kwargs)  # [B, S, H/sp, Dv]
    return _exchange(out, size, group, split=1, cat=2), None  # [B, s, H, Dv]


def register_attention() -> None:
    """Register `opslot_sp` with Transformers' AttentionInterface (idempotent). No mask function is
    registered: Transformers then builds no mask for the local slice (the wrapper builds the global one)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    ALL_ATTENTION_FUNCTIONS.register(SP_ATTENTION, sp_attention_forward)


# -- Gated DeltaNet ----------------------------------------------------------------------------------
class SequenceParallelKernel:
    """A token-mixer slot's bound kernel, head-parallel over the SP group for calls that carry a
    sequence-parallel context (`opslot_sp=`), unchanged for every other call."""

    def __init__(self, inner: Callable, op: str) -> None:
        self.inner, self.op = inner, op
        self.__wrapped__ = inner

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        ctx = kwargs.pop(CTX_KEY, None)
        if ctx is None:
            return self.inner(*args, **kwargs)
        if self.op == "causal_conv1d":
            return _sp_conv(self.inner, ctx, *args, **kwargs)
        return _sp_delta_rule(self.inner, ctx, *args, **kwargs)

    def __repr__(self) -> str:
        return f"SequenceParallelKernel({self.op}, {self.inner!r})"


@torch.compiler.disable
def _sp_conv(
    inner: Callable,
    ctx: SequenceParallelContext,
    hidden_states: Tensor,
    weight: Tensor,
    bias: Optional[Tensor] = None,
    activation: Optional[str] = None,
    cu_seqlens: Any = None,
    conv_state: Optional[Tensor] = None,
    **kwargs: Any,
) -> Tensor:
    """hidden_states [B, C, s] -> the depthwise causal conv of the whole sequence, [B, C, s]: C/sp
    channels of every token per rank (the conv of a channel needs only that channel)."""
    if conv_state is not None:
        raise ValueError(
            "sequence parallelism: causal_conv1d with a conv_state (decoding with a cache) is not supported"
        )
    st = ctx.state
    size, group = st.size, st.group
    block = hidden_states.shape[1] // size
    x = _exchange(hidden_states, size, group, split=1, cat=2)  # [B, C/sp, S]
    lo, hi = st.rank * block, (st.rank + 1) * block
    y = inner(
        x, weight[lo:hi], None if bias is None else bias[lo:hi], activation=activation, cu_seqlens=ctx.cu, **kwargs
    )
    return _exchange(y, size, group, split=2, cat=1)  # [B, C, s]


@torch.compiler.disable
def _sp_delta_rule(
    inner: Callable,
    ctx: SequenceParallelContext,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    g: Tensor,
    beta: Tensor,
    chunk_size: int = 64,
    initial_state: Optional[Tensor] = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens: Any = None,
    **kwargs: Any,
) -> Tuple[Tensor, None]:
    """q/k [B, s, Hk, Dk], v [B, s, Hv, Dv], g/beta [B, s, Hv] -> ([B, s, Hv, Dv], None): the delta rule
    over the whole sequence, Hv/sp heads per rank (q/k heads fewer than the ranks replicated)."""
    if initial_state is not None or output_final_state:
        raise ValueError(
            "sequence parallelism: chunk_gated_delta_rule with a recurrent state (a cache) is not supported"
        )
    st = ctx.state
    size, group = st.size, st.group
    heads_qk = query.shape[2]
    if heads_qk % size:
        if size % heads_qk:
            raise ValueError(
                f"sequence parallelism: {heads_qk} query/key heads of the delta rule neither split "
                f"over nor divide {size} ranks"
            )
        query = query.repeat_interleave(size // heads_qk, dim=2)
        key = key.repeat_interleave(size // heads_qk, dim=2)
    q = _exchange(query, size, group, split=2, cat=1)
    k = _exchange(key, size, group, split=2, cat=1)
    v = _exchange(value, size, group, split=2, cat=1)
    g2 = _exchange(g.unsqueeze(-1), size, group, split=2, cat=1).squeeze(-1)
    b2 = _exchange(beta.unsqueeze(-1), size, group, split=2, cat=1).squeeze(-1)
    out, _ = inner(
        q,
        k,
        v,
        g=g2,
        beta=b2,
        chunk_size=chunk_size,
        initial_state=None,
        output_final_state=False,
        use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
        cu_seqlens=ctx.cu,
        **kwargs,
    )
    return _exchange(out, size, group, split=1, cat=2), None  # [B, s, Hv, Dv]


def _gdn_modules(model: nn.Module) -> List[nn.Module]:
    return [m for m in model.modules() if type(m).__name__.endswith("GatedDeltaNet")]


def _slots_of(module: nn.Module, ops: Tuple[str, ...]) -> Dict[str, OpSlot]:
    """{op: slot} of the OpSlots of `ops` that guard `module`'s code: instance-scoped ones, else the
    module-level ones of the module that defines its class."""
    found: Dict[str, OpSlot] = {}
    for value in vars(module).values():
        if isinstance(value, OpSlot) and value.op in ops:
            found.setdefault(value.op, value)
    mod = sys.modules.get(type(module).__module__)
    for value in vars(mod).values() if mod is not None else ():
        if isinstance(value, OpSlot) and value.op in ops:
            found.setdefault(value.op, value)
    return found


# -- making a model sequence-parallel ---------------------------------------------------------------
def _sp_class(cls: type) -> type:
    return forward_subclass(cls, "SequenceParallel", _sp_forward, "_opslot_sp_base")


def _attention_modules(model: nn.Module) -> List[nn.Module]:
    return [m for m in model.modules() if hasattr(m, "num_key_value_groups") and hasattr(m, "head_dim")]


def _inner_attention(model: nn.Module) -> str:
    impl = getattr(model.config, "_attn_implementation", None)
    return "eager" if impl is None else impl


def _refusal(model: nn.Module, size: int) -> Optional[str]:
    """Why `model` cannot be made sequence-parallel over `size` ranks (the first reason), or None."""
    name = type(model).__name__
    if hasattr(model, "_opslot_sp"):
        return f"sequence_parallel: {name} is already sequence-parallel"
    config = getattr(model, "config", None)
    params = inspect.signature(type(model).forward).parameters
    if config is None or not hasattr(model, "lm_head") or not {"input_ids", "position_ids", "labels"} <= set(params):
        return (
            f"sequence_parallel: {name} is not a causal-LM text model (a config, an lm_head and a forward "
            f"taking input_ids, position_ids and labels)"
        )
    inner = _inner_attention(model)
    attention = _attention_modules(model)
    if attention and inner not in INNER_ATTENTION:
        return (
            f"sequence_parallel: attn_implementation {inner!r} is not supported; use one of "
            f"{', '.join(INNER_ATTENTION)} (the SP wrapper gives it the gathered sequence)"
        )
    if inner == "eager":
        missing = sorted(
            {
                type(m).__name__
                for m in attention
                if getattr(sys.modules.get(type(m).__module__), "eager_attention_forward", None) is None
            }
        )
        if missing:
            return (
                f"sequence_parallel: no eager_attention_forward beside {', '.join(missing)}; use sdpa or opslot_varlen"
            )
    if any(getattr(m, "sinks", None) is not None for m in attention):
        return f"sequence_parallel: {name} has attention sinks (one per head), which are not sharded over heads"
    heads, kv = getattr(config, "num_attention_heads", None), getattr(config, "num_key_value_heads", None)
    if attention:
        kv = kv or heads
        if heads % size:
            return f"sequence_parallel: {heads} attention heads do not split over {size} ranks"
        if kv % size and size % kv:
            return (
                f"sequence_parallel: {kv} key/value heads neither split over {size} ranks nor divide it "
                f"(to be replicated)"
            )
    gdn = _gdn_modules(model)
    if gdn:
        slots = _slots_of(gdn[0], _GDN_OPS)
        eager = [op for op in _GDN_OPS if op not in slots or not slots[op].use_non_eager_impl]
        if eager:
            return (
                f"sequence_parallel: the Gated DeltaNet layers of {name} run {', '.join(eager)} on upstream's "
                f"code; bind a kernel ('torch' or 'cuda': {', '.join(f'{op}_implementation' for op in eager)}), "
                f"whose calls sequence parallelism makes head-parallel"
            )
        m = gdn[0]
        if m.conv_dim % size or m.num_v_heads % size:
            return (
                f"sequence_parallel: Gated DeltaNet with {m.conv_dim} conv channels and {m.num_v_heads} value "
                f"heads does not split over {size} ranks"
            )
        if m.num_k_heads % size and size % m.num_k_heads:
            return (
                f"sequence_parallel: {m.num_k_heads} Gated DeltaNet key heads neither split over {size} ranks "
                f"nor divide it"
            )
    return None


def _plan(model: nn.Module, size: int) -> str:
    """What this rank is about to make sequence-parallel, in words: every rank of the group must say the same."""
    config = getattr(model, "config", None)
    digest = "-"
    if config is not None and hasattr(config, "to_json_string"):
        digest = hashlib.sha256(config.to_json_string(use_diff=False).encode()).hexdigest()[:12]
    dtypes = sorted({str(p.dtype).replace("torch.", "") for p in model.parameters()})
    return (
        f"{type(model).__name__}, sp={size}, attention={_inner_attention(model) if config is not None else '-'}, "
        f"config {digest}, {'/'.join(dtypes)}, {sum(p.numel() for p in model.parameters())} parameters"
    )


def _refusal_and_plan(model: nn.Module, size: int) -> Tuple[Optional[str], str]:
    """(_refusal, _plan), an unexpected exception of either being this rank's refusal: it must reach the
    agreement, or the other ranks would wait in it."""
    try:
        return _refusal(model, size), _plan(model, size)
    except Exception as exc:  # noqa: BLE001  (any failure here is reported by every rank)
        return f"sequence_parallel: {type(model).__name__}: {type(exc).__name__}: {exc}", "-"


def agree(what: str, group: Any, refusal: Optional[str], plan: str) -> None:
    """Every rank's refusal and plan, gathered (one all_gather_object over `group`): the same
    ValueError on every rank when any rank refuses (its own message when all refuse alike) or when
    the plans differ."""
    got: List[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(got, (refusal, plan), group=group)
    refusals = [r for r, _ in got]
    bad = [i for i, r in enumerate(refusals) if r]
    if bad and len(set(refusals)) == 1:
        raise ValueError(refusals[0])
    if bad:
        raise ValueError(
            f"{what} refused on {len(bad)} of {len(got)} ranks: " + "; ".join(f"rank {i}: {refusals[i]}" for i in bad)
        )
    if len({p for _, p in got}) > 1:
        raise ValueError(
            f"{what}: every rank must do the same, got " + "; ".join(f"rank {i}: {p}" for i, (_, p) in enumerate(got))
        )


def sequence_parallel(model: nn.Module, group: Any) -> nn.Module:
    """Make a generated causal-LM `model` sequence-parallel over `group` (a 1-D DeviceMesh or a process
    group; None: the default group). A collective over the group: the ranks agree (model, config,
    attention, head counts) before anything changes, so a refusal on any rank is the same ValueError on
    every rank. Call it on every rank, before FSDP (`parallelize` does both). The model then takes this
    rank's slice of every row (`shard_batch`) and returns the loss of the whole sequence."""
    if not dist.is_initialized():
        raise RuntimeError("sequence_parallel needs torch.distributed initialised (dist.init_process_group)")
    g = _group_of(group)
    size, rank = dist.get_world_size(g), dist.get_rank(g)
    agree("sequence_parallel", g, *_refusal_and_plan(model, size))
    register_attention()
    cls = type(model)
    inner = _inner_attention(model)
    attention = _attention_modules(model)
    eager_fns: Dict[type, Callable] = {}
    for m in attention:
        fn = getattr(sys.modules.get(type(m).__module__), "eager_attention_forward", None)
        if fn is not None:
            eager_fns[type(m)] = fn
    kv_rep = 1
    if attention:
        kv = model.config.num_key_value_heads or model.config.num_attention_heads
        kv_rep = 1 if kv % size == 0 else size // kv
    gdn_slots: List[OpSlot] = []
    for m in _gdn_modules(model):
        for op, slot in _slots_of(m, _GDN_OPS).items():
            if slot not in gdn_slots:
                gdn_slots.append(slot)
    for slot in gdn_slots:
        if not isinstance(slot.kernel, SequenceParallelKernel):
            slot.wrap_kernel(lambda fn, op=slot.op: SequenceParallelKernel(fn, op))
    mod = sys.modules.get(cls.__module__)
    moe = all(hasattr(model, a) for a in ("router_aux_loss_coef", "num_experts", "num_experts_per_tok"))
    lb = getattr(mod, "load_balancing_loss_func", None) if moe else None
    params = tuple(
        n
        for n, p in inspect.signature(cls.forward).parameters.items()
        if n != "self" and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    )
    state = SPState(
        g,
        size,
        rank,
        cls,
        params,
        inner,
        eager_fns,
        kv_rep,
        tuple(gdn_slots),
        lb,
        "router_aux_loss_coef" if lb is not None else None,
    )
    seen = set()
    for m in model.modules():
        config = getattr(m, "config", None)
        if config is not None and id(config) not in seen and hasattr(config, "_attn_implementation"):
            seen.add(id(config))
            config._attn_implementation = SP_ATTENTION
    model._opslot_sp = state
    model.__class__ = _sp_class(cls)
    return model


# -- the forward ---------------------------------------------------------------------------------------
def _flags(kw: Dict[str, Any], state: SPState, config: Any) -> List[int]:
    """This rank's inputs as host integers (agreed by the group before any exchange)."""
    ids, embeds = kw.get("input_ids"), kw.get("inputs_embeds")
    ref = ids if ids is not None else embeds
    batch, local = (tuple(ref.shape[:2]) + (0, 0))[:2] if torch.is_tensor(ref) and ref.dim() >= 2 else (-1, -1)
    pos, mask = kw.get("position_ids"), kw.get("attention_mask")
    intact = (
        all(isinstance(s.kernel, SequenceParallelKernel) for s in state.gdn_slots)
        and getattr(config, "_attn_implementation", None) == SP_ATTENTION
    )
    return [
        batch,
        local,
        int(ids is not None),
        int(embeds is not None),
        _rank_of(pos),
        _rank_of(mask),
        int(kw.get("labels") is not None),
        int(kw.get("shift_labels") is not None),
        int(kw.get("past_key_values") is not None),
        int(kw.get("cu_seq_lens_q") is not None),
        int(kw.get("num_items_in_batch") is not None),
        int(_keeps_some_logits(kw.get("logits_to_keep"))),
        int(intact),
        int(_shapes_fit(kw, batch, local)),
    ]


def _rank_of(x: Any) -> int:
    """-1: not given; -2: not a tensor; else its number of dimensions."""
    return -1 if x is None else (x.dim() if torch.is_tensor(x) else -2)


def _shapes_fit(kw: Dict[str, Any], batch: int, local: int) -> bool:
    """Labels and the padding mask [batch, local], position ids [local], [1, local] or [batch, local]."""
    for name in ("labels", "shift_labels", "attention_mask"):
        x = kw.get(name)
        if x is not None and (not torch.is_tensor(x) or tuple(x.shape) != (batch, local)):
            return False
    pos = kw.get("position_ids")
    if pos is not None and torch.is_tensor(pos) and tuple(pos.shape) not in ((local,), (1, local), (batch, local)):
        return False
    return True


def _keeps_some_logits(value: Any) -> bool:
    return value is not None and not (isinstance(value, int) and value == 0)


_FLAG_WORDS = (
    "",
    "",
    "input_ids",
    "inputs_embeds",
    "position_ids",
    "attention_mask",
    "labels",
    "shift_labels",
    "past_key_values",
    "cu_seq_lens_q",
    "num_items_in_batch",
    "logits_to_keep",
    "",
)


def _describe(flags: List[int]) -> str:
    words = [f"{flags[0]} x {flags[1]} tokens"]
    for i in range(2, 12):
        if flags[i] > 0 or (i in (4, 5) and flags[i] >= 0):
            words.append(_FLAG_WORDS[i] + (f" {flags[i]}-D" if i in (4, 5) else ""))
    if not flags[12]:
        words.append("attention or token-mixer kernels changed")
    if not flags[13]:
        words.append("labels / mask / position ids of another shape")
    return ", ".join(words)


def _agree_inputs(state: SPState, kw: Dict[str, Any], device: torch.device, config: Any) -> Tuple[int, int]:
    flags = _flags(kw, state, config)
    got = _gather_ints(flags, state.group, device)
    if any(f != got[0] for f in got):
        raise ValueError(
            "sequence parallelism: every rank of the SP group must pass the same batch shape and the "
            "same inputs (its slice of each), got " + "; ".join(f"rank {r}: {_describe(f)}" for r, f in enumerate(got))
        )
    batch, local, ids, embeds, pos_dim, mask_dim, labels, shift, pkv, cu, _, keep, intact, fit = got[0]
    if ids == embeds:
        raise ValueError("sequence parallelism: pass exactly one of input_ids and inputs_embeds")
    if local < 1 or batch < 1:
        raise ValueError(f"sequence parallelism: every rank needs at least one token per row, got {batch} x {local}")
    if pkv:
        raise ValueError(
            "sequence parallelism: past_key_values (a cache, generation) is not supported; "
            "generate with the unsharded model"
        )
    if cu:
        raise ValueError(
            "sequence parallelism: pass position_ids (restarting per document) instead of "
            "cu_seq_lens_q/k: the documents are found on the gathered position ids (shard_batch "
            "drops them)"
        )
    if keep:
        raise ValueError(
            "sequence parallelism: logits_to_keep is not supported (every rank holds a slice of the "
            "sequence); pass logits_to_keep=0"
        )
    if labels and shift:
        raise ValueError("sequence parallelism: pass labels or shift_labels, not both")
    if pos_dim not in (-1, 1, 2):
        raise ValueError(f"sequence parallelism: position_ids must be [seq] or [batch, seq], got {pos_dim}-D")
    if mask_dim not in (-1, 2):
        raise ValueError(
            f"sequence parallelism: attention_mask must be a 2-D padding mask [batch, seq], got {mask_dim}-D"
        )
    if not fit:
        raise ValueError(
            f"sequence parallelism: labels, shift_labels and attention_mask must be [batch, seq] like "
            f"the inputs ({batch} x {local} on every rank), position_ids [seq], [1, seq] or [batch, seq]"
        )
    if not intact:
        raise ValueError(
            f"sequence parallelism: the attention implementation (config._attn_implementation must "
            f"stay {SP_ATTENTION!r}) or the causal_conv1d / chunk_gated_delta_rule slots were changed "
            f"after sequence_parallel; build the model again"
        )
    return batch, local


def _prepare(state: SPState, kw: Dict[str, Any], config: Any) -> Tuple[Dict[str, Any], SequenceParallelContext]:
    ref = kw.get("input_ids") if kw.get("input_ids") is not None else kw.get("inputs_embeds")
    device = ref.device if torch.is_tensor(ref) else torch.device("cpu")
    batch, local = _agree_inputs(state, kw, device, config)
    size, rank = state.size, state.rank
    total = size * local
    pos, mask = kw.get("position_ids"), kw.get("attention_mask")
    labels = kw.get("labels") if kw.get("labels") is not None else kw.get("shift_labels")
    rows: List[Tensor] = []
    if pos is not None:
        rows.append(pos.reshape(-1, local).expand(batch, local).long())
    if labels is not None:
        rows.append(labels.long())
    if mask is not None:
        rows.append(mask.long())
    gathered: List[Tensor] = []
    if rows:
        stacked = torch.stack([r.to(device) for r in rows])  # [k, B, s]
        parts = [torch.empty_like(stacked) for _ in range(size)]
        dist.all_gather(parts, stacked.contiguous(), group=state.group)
        gathered = list(torch.stack(parts, 2).reshape(len(rows), batch, total).unbind(0))
    pos_g = gathered.pop(0) if pos is not None else torch.arange(total, device=device).expand(batch, total)
    lab_g = gathered.pop(0) if labels is not None else None
    mask_g = gathered.pop(0) if mask is not None else None

    starts = torch.ones_like(pos_g, dtype=torch.bool)
    starts[:, 1:] = pos_g[:, 1:] != pos_g[:, :-1] + 1
    real = mask_g.bool() if mask_g is not None else None
    checks = [starts[:, 1:].any()]
    if real is not None:
        checks.append((real[:, 1:] <= real[:, :-1]).all())  # ones, then zeros, in every row
    packed, trailing = (torch.stack(checks).tolist() + [True])[:2]  # one host read
    cu, longest = None, 0
    if packed:
        from .packing import boundaries

        cu, longest, _ = boundaries(pos_g)
    key_mask = None
    if real is not None:
        if not trailing:
            if packed:
                raise ValueError(
                    "sequence parallelism: a packed row (position ids restarting) with padding that is "
                    "not at the end of its row; pad at the end (shard_batch does) or do not pack"
                )
            key_mask = real
    local_labels = None
    if lab_g is not None:
        if kw.get("labels") is not None:
            lab_g = lab_g.masked_fill(starts, -100)  # a document's first token is never a target
            shift_g = torch.cat([lab_g[:, 1:], lab_g.new_full((batch, 1), -100)], 1)
        else:
            ends = torch.zeros_like(starts)
            ends[:, :-1] = starts[:, 1:]
            shift_g = lab_g.masked_fill(ends, -100)
        if kw.get("num_items_in_batch") is None:
            kw["num_items_in_batch"] = (shift_g != -100).sum()
        local_labels = shift_g[:, rank * local : (rank + 1) * local].contiguous()
    ctx = SequenceParallelContext(state, batch, local, pos_g, packed, cu, longest, key_mask, mask_g)
    out = dict(kw)
    out.pop("shift_labels", None)
    if local_labels is not None:
        out["labels"] = local_labels  # the loss reads shift_labels
        out["shift_labels"] = local_labels
    out["position_ids"] = pos_g[:, rank * local : (rank + 1) * local]
    out["attention_mask"] = None if (mask is None or packed) else mask
    out["use_cache"] = False
    out[CTX_KEY] = ctx
    return out, ctx


def _router_logits_global(logits: Tuple[Tensor, ...], ctx: SequenceParallelContext) -> Tuple[Tensor, ...]:
    """Every layer's router logits [B·s, E] gathered into the global [B·S, E] (row b·S + t)."""
    st = ctx.state
    stacked = torch.stack([x.reshape(ctx.batch, ctx.local, -1) for x in logits], 0)  # [L, B, s, E]
    got = _AllGather.apply(stacked, st.group, st.size)  # [sp, L, B, s, E]
    got = got.permute(1, 2, 0, 3, 4).reshape(len(logits), ctx.batch * ctx.total, -1)
    return tuple(got.unbind(0))


def _sp_forward(self, *args: Any, **kwargs: Any) -> Any:
    st: SPState = self._opslot_sp
    for name, value in zip(st.params, args):
        if name in kwargs:
            raise TypeError(f"{type(self).__name__}.forward got multiple values for argument {name!r}")
        kwargs[name] = value
    if len(args) > len(st.params):
        raise TypeError(f"{type(self).__name__}.forward takes {len(st.params)} positional arguments")
    return_dict = kwargs.pop("return_dict", None)
    if return_dict is None:
        return_dict = getattr(self.config, "return_dict", True)
    kw, ctx = _prepare(st, kwargs, self.config)
    coef = None
    if st.aux_attr is not None:
        coef = getattr(self, st.aux_attr)
        setattr(self, st.aux_attr, 0.0)  # the local aux loss adds nothing; the global one is added below
    try:
        out = st.base.forward(self, **kw, return_dict=True)
    finally:
        if coef is not None:
            setattr(self, st.aux_attr, coef)
    loss = out.get("loss")
    if loss is not None:
        loss = all_reduce_sum(loss, st.group)
    router = out.get("router_logits")
    if st.lb_func is not None and out.get("aux_loss") is not None and router:
        router = _router_logits_global(tuple(router), ctx)
        aux = st.lb_func(router, self.num_experts, self.num_experts_per_tok, ctx.mask)
        out["router_logits"] = router
        out["aux_loss"] = aux
        if loss is not None:
            loss = loss + coef * aux.to(loss.device)
    if loss is not None:
        out["loss"] = loss
    return out if return_dict else out.to_tuple()


# -- batches -------------------------------------------------------------------------------------------
def shard_batch(
    batch: Mapping[str, Any],
    group: Any = None,
    *,
    size: Optional[int] = None,
    rank: Optional[int] = None,
    pad_token_id: int = 0,
    ignore_index: int = -100,
) -> Dict[str, Any]:
    """This rank's slice of a global batch along the sequence (no collective).

    `batch`: input_ids or inputs_embeds [B, S(, H)], and optionally labels / shift_labels, position_ids
    ([S], [1, S] or [B, S]: packed rows restart them), attention_mask [B, S]; cu_seq_lens_q/k and
    max_length_q/k (a collator's) are dropped (the model finds the documents on the gathered position
    ids; position_ids are then required); other non-tensor entries pass through. `group`: the SP
    group (a 1-D mesh or a process group), or `size` and `rank`. S is padded to a multiple of the SP
    size at the end of every row: input_ids with `pad_token_id`, inputs_embeds with zeros, labels with
    `ignore_index`, position_ids continuing each row (the padding joins the last document), and an
    attention_mask (made when the batch had none) 0 on the padding, so that it is no target, no
    key of a real token (causal) and no token of the MoE router statistics."""
    if size is None or rank is None:
        g = _group_of(group)
        size, rank = dist.get_world_size(g), dist.get_rank(g)
    ref = batch.get("input_ids") if batch.get("input_ids") is not None else batch.get("inputs_embeds")
    if not torch.is_tensor(ref) or ref.dim() < 2:
        raise ValueError("shard_batch: the batch needs input_ids [batch, seq] or inputs_embeds [batch, seq, hidden]")
    rows, seq = ref.shape[:2]
    has_cu = any(batch.get(k) is not None for k in ("cu_seq_lens_q", "cu_seq_lens_k"))
    if has_cu and batch.get("position_ids") is None:
        raise ValueError(
            "shard_batch: cu_seq_lens_q/k without position_ids; pass the position ids restarting per "
            "document (DataCollatorWithFlattening(return_position_ids=True))"
        )
    unknown = [
        k
        for k, v in batch.items()
        if torch.is_tensor(v)
        and k not in _SEQ_INPUTS
        and k not in ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")
    ]
    if unknown:
        raise ValueError(f"shard_batch: do not know how to shard {', '.join(unknown)} along the sequence")
    pad = (-seq) % size
    local = (seq + pad) // size
    lo, hi = rank * local, (rank + 1) * local
    out: Dict[str, Any] = {}
    for key, value in batch.items():
        if key in ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k"):
            continue
        if not torch.is_tensor(value) or key not in _SEQ_INPUTS:
            out[key] = value
            continue
        if key == "position_ids":
            value = value.reshape(-1, seq)
            if pad:
                step = torch.arange(1, pad + 1, device=value.device, dtype=value.dtype)
                value = torch.cat([value, value[:, -1:] + step], 1)
        elif pad:
            fill = {
                "input_ids": pad_token_id,
                "labels": ignore_index,
                "shift_labels": ignore_index,
                "attention_mask": 0,
                "inputs_embeds": 0,
            }[key]
            shape = list(value.shape)
            shape[1] = pad
            value = torch.cat([value, value.new_full(shape, fill)], 1)
        out[key] = value[:, lo:hi].contiguous()
    if pad and batch.get("attention_mask") is None:
        mask = torch.ones(rows, seq + pad, dtype=torch.long, device=ref.device)
        mask[:, seq:] = 0
        out["attention_mask"] = mask[:, lo:hi].contiguous()
    return out


# -- meshes and the one call ---------------------------------------------------------------------------
class Parallel(NamedTuple):
    """What `parallelize` made: `mesh` the 2-D ("dp", "sp") mesh, `sp` this rank's SP group (1-D),
    `meshes` the FSDP / expert-parallel meshes (opslot.distributed.Meshes; None without FSDP and EP)."""

    mesh: Any
    sp: Any
    meshes: Any


def init_sp_mesh(device_type: str, sp: int) -> Any:
    """The ("dp", "sp") mesh of shape (world // sp, sp) over every rank: SP groups are consecutive
    ranks (NVLink on one host). `sp` must divide the world and be the same on every rank (agreed)."""
    from torch.distributed.device_mesh import init_device_mesh

    world = dist.get_world_size()
    asked = [s for (s,) in _gather_ints([sp], dist.group.WORLD, torch.device(device_type))]
    if len(set(asked)) > 1:
        raise ValueError(
            "init_sp_mesh: every rank must ask for the same sequence-parallel size, got "
            + ", ".join(f"rank {r}: {s}" for r, s in enumerate(asked))
        )
    if sp < 1 or world % sp:
        raise ValueError(f"sequence-parallel size {sp} must divide the world size {world}")
    return init_device_mesh(device_type, (world // sp, sp), mesh_dim_names=("dp", "sp"))


def parallelize(
    model: nn.Module,
    mesh: Any = None,
    *,
    sp: Optional[int] = None,
    ep: int = 1,
    fsdp: bool = True,
    ep_mode: str = "splits",
    capacity: Optional[int] = None,
    **fsdp_kwargs: Any,
) -> Parallel:
    """Sequence parallelism, expert parallelism and FSDP2 of a generated causal-LM in one call, on every
    rank (same weights on every rank; activation checkpointing and torch.compile of the layers before).

    `mesh`: a DeviceMesh with an "sp" dimension (e.g. ("dp", "sp")), or None: `init_sp_mesh` over every
    rank with `sp` (default 1). The model is made sequence-parallel over mesh["sp"]; with `ep` > 1 its
    experts expert-parallel over groups of `ep` consecutive ranks (`shard_experts(mode=ep_mode,
    capacity=capacity)`); with `fsdp` every decoder layer and the root are sharded with FSDP2 over every
    rank (`fully_shard_model`; `fsdp_kwargs` go to each `fully_shard`): the SP ranks of a data-parallel
    replica hold the same parameters and their gradients are averaged with the replicas' (see the
    module docstring), so FSDP2's mean over every rank is the gradient of the mean loss. The ranks
    agree on (sp, ep, fsdp, ep_mode, capacity) first: a difference is the same ValueError on every rank."""
    from torch.distributed.device_mesh import init_device_mesh

    if not dist.is_initialized():
        raise RuntimeError("parallelize needs torch.distributed initialised (dist.init_process_group)")
    device_type = mesh.device_type if mesh is not None else next(model.parameters()).device.type
    if mesh is not None:
        names = tuple(mesh.mesh_dim_names or ())
        if "sp" not in names:
            raise ValueError(f"parallelize: the mesh needs an 'sp' dimension, got dimensions {names}")
        if sp is not None and sp != mesh["sp"].size():
            raise ValueError(f"parallelize: sp={sp} but the mesh's sp dimension has {mesh['sp'].size()} ranks")
        sp = mesh["sp"].size()
    sp = 1 if sp is None else sp
    world = dist.get_world_size()
    refusal = None
    if sp < 1 or world % sp:
        refusal = f"parallelize: sequence-parallel size {sp} must divide the world size {world}"
    elif ep < 1 or world % ep:
        refusal = f"parallelize: expert-parallel size {ep} must divide the world size {world}"
    agree(
        "parallelize",
        dist.group.WORLD,
        refusal,
        f"sp={sp}, ep={ep}, fsdp={fsdp}, ep_mode={ep_mode!r}, capacity={capacity}",
    )
    if mesh is None:
        mesh = init_device_mesh(device_type, (world // sp, sp), mesh_dim_names=("dp", "sp"))
    sequence_parallel(model, mesh["sp"])
    meshes = None
    if ep > 1:
        meshes = init_meshes(device_type, ep=ep)
        shard_experts(model, meshes.ep, mode=ep_mode, capacity=capacity)
    if fsdp:
        if meshes is None:
            meshes = init_meshes(device_type, ep=1)
        fully_shard_model(model, meshes, **fsdp_kwargs)
    return Parallel(mesh, mesh["sp"], meshes)


register_attention()

__all__ = [
    "SP_ATTENTION",
    "CTX_KEY",
    "INNER_ATTENTION",
    "Parallel",
    "SPState",
    "SequenceParallelContext",
    "SequenceParallelKernel",
    "agree",
    "all_reduce_sum",
    "average_gradients",
    "init_sp_mesh",
    "parallelize",
    "register_attention",
    "sequence_parallel",
    "shard_batch",
    "sp_attention_forward",
]
