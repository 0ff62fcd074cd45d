"""The generated example modules, imported and run with a stub OpSlot (torch CPU).

Unbound slots must run the upstream code: outputs equal the upstream example model's with the same
weights, bit for bit. Bound slots must dispatch with exactly the arguments the spec's guard passes,
and what the slot returns must be what the guarded code returns.
"""

import os

import pytest
import torch
from toyformers.models.toy import modeling_toy as upstream_toy
from toyformers.models.toy.configuration_toy import ToyConfig
from toyformers.models.toy_moe import modeling_toy_moe as upstream_moe
from toyformers.models.toy_moe.configuration_toy_moe import ToyMoeConfig

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def toy(load_generated):
    return load_generated("patched_modeling_toy_gpu")


@pytest.fixture
def toy_moe(load_generated):
    return load_generated("patched_modeling_toy_moe_gpu")


def make_pair(upstream_cls, generated_cls, config):
    """An upstream model and a generated one holding the same weights."""
    torch.manual_seed(0)
    upstream = upstream_cls(config).eval()
    generated = generated_cls(config).eval()
    generated.load_state_dict(upstream.state_dict())
    return upstream, generated


def batch():
    torch.manual_seed(1)
    input_ids = torch.randint(0, 64, (2, 6))
    attention_mask = torch.ones(2, 6, dtype=torch.long)
    attention_mask[1, :2] = 0
    return input_ids, attention_mask


class Recorder:
    """A kernel stand-in: records its arguments, returns a fixed value (or calls `compute`)."""

    def __init__(self, result=None, compute=None):
        self.result = result
        self.compute = compute
        self.calls = []

    def __call__(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        return self.compute(*args, **kwargs) if self.compute else self.result


def test_unbound_slots_run_upstream_code_toy(toy):
    upstream, generated = make_pair(upstream_toy.ToyForCausalLM, toy.ToyForCausalLM, ToyConfig())
    input_ids, attention_mask = batch()
    expected = upstream(input_ids, attention_mask=attention_mask, labels=input_ids)
    actual = generated(input_ids, attention_mask=attention_mask, labels=input_ids)
    assert torch.equal(actual.logits, expected.logits)
    assert torch.equal(actual.loss, expected.loss)
    for slot in (toy.rms_norm_slot, toy.rope_slot, toy.swiglu_mlp_slot, toy.causal_lm_loss_slot):
        assert not slot.use_non_eager_impl and slot.calls == []


def test_unbound_slots_run_upstream_code_toy_moe(toy_moe):
    config = ToyMoeConfig(output_router_logits=True)
    upstream, generated = make_pair(upstream_moe.ToyMoeForCausalLM, toy_moe.ToyMoeForCausalLM, config)
    input_ids, attention_mask = batch()
    expected = upstream(input_ids, attention_mask=attention_mask, labels=input_ids)
    actual = generated(input_ids, attention_mask=attention_mask, labels=input_ids)
    assert torch.equal(actual.logits, expected.logits)
    assert torch.equal(actual.aux_loss, expected.aux_loss)
    assert torch.equal(actual.loss, expected.loss)


def test_slot_declarations_follow_the_spec(toy, toy_moe):
    declared = {name: (slot.op, slot.variant) for name, slot in vars(toy).items() if isinstance(slot, toy.OpSlot)}
    assert declared == {
        "rms_norm_slot": ("rms_norm", "standard"),
        "rope_slot": ("rotary_pos_emb", "full"),
        "swiglu_mlp_slot": ("swiglu_mlp", "standard"),
        "causal_lm_loss_slot": ("cross_entropy_loss", "causal"),
    }
    declared_moe = {
        name: (slot.op, slot.variant) for name, slot in vars(toy_moe).items() if isinstance(slot, toy_moe.OpSlot)
    }
    # moe_experts_slot is instance-scoped: it lives on each ToyMoeExperts, not in the module.
    assert declared_moe == {
        "load_balancing_loss_slot": ("load_balancing_loss", "standard"),
        "causal_lm_loss_slot": ("cross_entropy_loss", "causal"),
    }


def test_excluded_class_is_gone(toy):
    assert not hasattr(toy, "ToyForSequenceClassification")
    assert not hasattr(toy, "SequenceClassifierOutput")
    assert toy.__all__ == ["ToyForCausalLM", "ToyModel", "ToyPreTrainedModel"]


def test_rms_norm_entry_guard_dispatches(toy):
    norm = toy.ToyRMSNorm(8, eps=1e-5)
    x = torch.randn(2, 3, 8)
    sentinel = torch.full((2, 3, 8), 7.0)
    kernel = Recorder(sentinel)
    toy.rms_norm_slot.bind(kernel)
    assert norm(x) is sentinel
    ((args, kwargs),) = kernel.calls
    assert args[0] is x and args[1] is norm.weight and args[2] == 1e-5 and kwargs == {}


def test_rope_entry_guard_dispatches_with_keyword(toy):
    q, k = torch.randn(1, 4, 3, 8), torch.randn(1, 2, 3, 8)
    cos, sin = torch.randn(1, 3, 8), torch.randn(1, 3, 8)
    kernel = Recorder(("q_embed", "k_embed"))
    toy.rope_slot.bind(kernel)
    assert toy.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=2) == ("q_embed", "k_embed")
    ((args, kwargs),) = kernel.calls
    assert all(a is b for a, b in zip(args, (q, k, cos, sin))) and len(args) == 4
    assert kwargs == {"unsqueeze_dim": 2}


def test_swiglu_entry_guard_passes_the_module(toy):
    mlp = toy.ToyMLP(ToyConfig())
    x = torch.randn(2, 3, 32)
    sentinel = torch.zeros(2, 3, 32)
    kernel = Recorder(sentinel)
    toy.swiglu_mlp_slot.bind(kernel)
    assert mlp(x) is sentinel
    ((args, kwargs),) = kernel.calls
    assert args[0] is mlp and args[1] is x and kwargs == {}


def test_bound_slots_give_upstream_results_through_reference_kernels(toy):
    """Kernels that compute the upstream math reproduce the upstream model exactly."""
    upstream, generated = make_pair(upstream_toy.ToyForCausalLM, toy.ToyForCausalLM, ToyConfig())
    norm = Recorder(
        compute=lambda x, w, eps: upstream_toy.ToyRMSNorm.forward(
            type("N", (), {"weight": w, "variance_epsilon": eps})(), x
        )
    )
    rope = Recorder(compute=upstream_toy.apply_rotary_pos_emb)
    mlp = Recorder(compute=lambda module, x: upstream_toy.ToyMLP.forward(module, x))
    toy.rms_norm_slot.bind(norm)
    toy.rope_slot.bind(rope)
    toy.swiglu_mlp_slot.bind(mlp)
    input_ids, attention_mask = batch()
    expected = upstream(input_ids, attention_mask=attention_mask)
    actual = generated(input_ids, attention_mask=attention_mask)
    assert torch.equal(actual.logits, expected.logits)
    layers = ToyConfig().num_hidden_layers
    # Per layer: input, post-attention, q and k norms; plus the final norm.
    assert len(norm.calls) == 4 * layers + 1
    assert len(rope.calls) == layers and len(mlp.calls) == layers


def test_causal_lm_loss_call_site_guard_replaces_logits_and_loss(toy):
    model = toy.ToyForCausalLM(ToyConfig()).eval()
    lm_head_calls = []
    model.lm_head.register_forward_hook(lambda *args: lm_head_calls.append(args))
    logits, loss = torch.zeros(2, 6, 64), torch.tensor(3.5)
    kernel = Recorder((logits, loss))
    toy.causal_lm_loss_slot.bind(kernel)
    input_ids, attention_mask = batch()
    labels = input_ids.clone()

    output = model(input_ids, attention_mask=attention_mask, labels=labels, logits_to_keep=4)

    assert output.logits is logits and output.loss is loss
    assert lm_head_calls == []  # the else-branch (upstream lm_head + loss) did not run
    ((args, kwargs),) = kernel.calls
    hidden = model.model(input_ids, attention_mask=attention_mask).last_hidden_state
    assert args[0] is model and args[2] is labels and kwargs == {}
    assert torch.equal(args[1], hidden[:, -4:, :])


def test_causal_lm_loss_slot_without_labels(toy):
    model = toy.ToyForCausalLM(ToyConfig()).eval()
    logits = torch.ones(1, 6, 64)
    kernel = Recorder((logits, None))
    toy.causal_lm_loss_slot.bind(kernel)
    input_ids, _ = batch()
    output = model(input_ids[:1])
    assert output.logits is logits and output.loss is None
    ((args, _),) = kernel.calls
    assert args[2] is None


def test_instance_scoped_moe_slot_binds_per_model(toy_moe):
    config = ToyMoeConfig()
    upstream, unbound = make_pair(upstream_moe.ToyMoeForCausalLM, toy_moe.ToyMoeForCausalLM, config)
    kernel = Recorder(compute=lambda module, *args: upstream_moe.ToyMoeExperts.forward(module, *args))
    bound_config = ToyMoeConfig()
    bound_config.stub_ops = {"moe": kernel}
    bound = toy_moe.ToyMoeForCausalLM(bound_config).eval()
    bound.load_state_dict(upstream.state_dict())

    experts = [layer.mlp.experts for layer in bound.model.layers]
    assert all(e.moe_experts_slot.use_non_eager_impl for e in experts)
    assert len({id(e.moe_experts_slot) for e in experts}) == len(experts)
    assert not any(layer.mlp.experts.moe_experts_slot.use_non_eager_impl for layer in unbound.model.layers)

    input_ids, attention_mask = batch()
    expected = upstream(input_ids, attention_mask=attention_mask).logits
    assert torch.equal(bound(input_ids, attention_mask=attention_mask).logits, expected)
    assert torch.equal(unbound(input_ids, attention_mask=attention_mask).logits, expected)
    assert [args[0] for args, _ in kernel.calls] == experts
    for args, kwargs in kernel.calls:
        hidden_states, top_k_index, top_k_weights = args[1:]
        assert hidden_states.shape == (12, config.hidden_size) and kwargs == {}
        assert top_k_index.shape == top_k_weights.shape == (12, config.num_experts_per_tok)


def test_moe_experts_slot_return_value_is_used(toy_moe):
    config = ToyMoeConfig()
    sentinel = torch.zeros(5, config.hidden_size)
    config.stub_ops = {"moe": Recorder(sentinel)}
    experts = toy_moe.ToyMoeExperts(config)
    out = experts(torch.randn(5, config.hidden_size), torch.zeros(5, 2, dtype=torch.long), torch.ones(5, 2))
    assert out is sentinel


def test_load_balancing_loss_guard_dispatches(toy_moe):
    config = ToyMoeConfig(output_router_logits=True)
    upstream, generated = make_pair(upstream_moe.ToyMoeForCausalLM, toy_moe.ToyMoeForCausalLM, config)
    aux = torch.tensor(0.25)
    kernel = Recorder(aux)
    toy_moe.load_balancing_loss_slot.bind(kernel)
    input_ids, attention_mask = batch()
    output = generated(input_ids, attention_mask=attention_mask)
    assert output.aux_loss is aux
    ((args, kwargs),) = kernel.calls
    gate_logits, num_experts, top_k, mask = args
    assert isinstance(gate_logits, tuple) and len(gate_logits) == config.num_hidden_layers
    assert all(
        torch.equal(g, u) for g, u in zip(gate_logits, upstream(input_ids, attention_mask=attention_mask).router_logits)
    )
    assert (num_experts, top_k) == (config.num_experts, config.num_experts_per_tok)
    assert mask is attention_mask and kwargs == {}


def test_added_methods_and_helpers(toy, toy_moe):
    model = toy.ToyForCausalLM(ToyConfig())
    total = sum(p.numel() for p in model.parameters())
    assert model.num_parameters() == total
    assert toy.count_toy_parameters(model) == total
    assert toy.ToyPreTrainedModel.supports_opslot() is True
    assert model.model.residual_hook is None
    assert all(layer.residual_hook is None for layer in model.model.layers)
    assert toy._rope_scale(16) == 0.25
    assert toy.ToyRotaryEmbedding(ToyConfig()).attention_scaling == 1.0
    moe_model = toy_moe.ToyMoeForCausalLM(ToyMoeConfig())
    assert moe_model.num_parameters() == sum(p.numel() for p in moe_model.parameters())
    assert toy_moe.count_toy_parameters.__annotations__["model"] is toy_moe.ToyMoePreTrainedModel


def test_residual_hook_from_override_sees_each_residual(toy):
    model = toy.ToyForCausalLM(ToyConfig()).eval()
    seen = []
    for layer in model.model.layers:
        layer.residual_hook = lambda residual: seen.append(residual.shape) or residual
    input_ids, _ = batch()
    model(input_ids)
    assert seen == [torch.Size([2, 6, 32])] * (2 * ToyConfig().num_hidden_layers)


def test_npu_sibling_drops_the_loss_slot_and_shares_experts_slot(load_generated):
    npu = load_generated("patched_modeling_toy_moe_npu")
    declared = {name: (slot.op, slot.variant) for name, slot in vars(npu).items() if isinstance(slot, npu.OpSlot)}
    assert declared == {
        "moe_experts_slot": ("moe", "standard"),
        "load_balancing_loss_slot": ("load_balancing_loss", "standard"),
    }
    kernel = Recorder(torch.zeros(3, 32))
    npu.moe_experts_slot.bind(kernel)
    experts = npu.ToyMoeExperts(ToyMoeConfig())
    assert not hasattr(experts, "moe_experts_slot")
    hidden_states = torch.randn(3, 32)
    experts(hidden_states, torch.zeros(3, 2, dtype=torch.long), torch.ones(3, 2))
    ((args, _),) = kernel.calls
    assert args[0] is experts and args[1] is hidden_states


def test_committed_example_outputs_are_current(generated_dir):
    """generated/example/ holds exactly what the binary generates now (`patchgen --all --diff`)."""
    committed_dir = os.path.join(REPO, "generated", "example")
    names = sorted(os.listdir(generated_dir))
    assert names == sorted(os.listdir(committed_dir))
    for name in names:
        with (
            open(os.path.join(generated_dir, name), "rb") as fresh,
            open(os.path.join(committed_dir, name), "rb") as committed,
        ):
            assert fresh.read() == committed.read(), name + " is stale: run patchgen --all --diff"
