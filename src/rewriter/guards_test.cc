// PlanGuards: exact text of guarded upstream shapes (written by us in HF style) and exact errors.
#include "rewriter/guards.h"

#include <catch2/catch.hpp>

#include "parser/py_module.h"
#include "rewriter/edit_plan.h"
#include "spec/spec_loader.h"

namespace patchgen::rewriter {
namespace {

const char* const kSpecHead =
    "version: 1\n"
    "upstream: transformers.models.qwen3.modeling_qwen3\n"
    "output: patched_modeling_qwen3.py\n";

std::string Errors(const std::vector<Diagnostic>& diags) {
  std::string out;
  for (const Diagnostic& d : diags) out += FormatDiagnostic(d);
  return out;
}

struct Outcome {
  std::string text;    ///< Upstream with the guard edits applied (declarations not inserted).
  std::string errors;  ///< Formatted diagnostics, empty on success.
  GuardPlan plan;
};

/// Loads `slots_yaml` (the `slots:` part of a spec), parses `upstream`, plans and applies.
Outcome Run(const std::string& slots_yaml, const std::string& upstream,
            void (*tweak)(spec::PatchSpec&) = nullptr) {
  auto spec = spec::LoadSpecFromString("specs/qwen3/spec.yaml", kSpecHead + slots_yaml);
  REQUIRE(spec.ok());
  if (tweak) tweak(*spec);
  auto module = parser::PyModule::Parse("modeling_qwen3.py", upstream);
  REQUIRE(module.ok());
  Outcome out;
  Result<GuardPlan> plan = PlanGuards(*spec, **module, "opslot");
  if (!plan.ok()) {
    out.errors = Errors(plan.errors());
    return out;
  }
  out.plan = *plan;
  EditPlan edits;
  for (const TextEdit& e : plan->edits) edits.Add(e);
  std::vector<Diagnostic> overlaps = edits.Validate();
  out.errors = Errors(overlaps);
  out.text = edits.Apply(upstream);
  // Whatever the guards produce must still be valid Python.
  auto reparsed = parser::PyModule::Parse("out.py", out.text);
  if (!reparsed.ok()) out.errors += Errors(reparsed.errors());
  return out;
}

const char* const kRmsNormDoc = R"(import torch
from torch import nn


class Qwen3RMSNorm(nn.Module):
    def __init__(self, hidden_size, eps=1e-6):
        """
        Qwen3RMSNorm is equivalent to T5LayerNorm
        """
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        """
        Normalizes the last dimension.
        """
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)
)";

const char* const kRmsNormSlot = R"(slots:
  - name: rms_norm_slot
    op: rms_norm
    variant: standard
    guards:
      - in: Qwen3RMSNorm.forward
        call: rms_norm_slot(hidden_states, self.weight, self.variance_epsilon)
)";

TEST_CASE("entry guard goes after the docstring of RMSNorm.forward", "[guards]") {
  Outcome out = Run(kRmsNormSlot, kRmsNormDoc);
  REQUIRE(out.errors == "");
  CHECK(out.text == R"(import torch
from torch import nn


class Qwen3RMSNorm(nn.Module):
    def __init__(self, hidden_size, eps=1e-6):
        """
        Qwen3RMSNorm is equivalent to T5LayerNorm
        """
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        """
        Normalizes the last dimension.
        """
        # patchgen: guard rms_norm_slot -> rms_norm/standard (specs/qwen3/spec.yaml:9)
        if rms_norm_slot.use_non_eager_impl:
            return rms_norm_slot(hidden_states, self.weight, self.variance_epsilon)
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)
)");
  CHECK(out.plan.declarations ==
        "from opslot import OpSlot\n\nrms_norm_slot = OpSlot(\"rms_norm\", \"standard\")\n");
  REQUIRE(out.plan.applied.size() == 1);
  CHECK(out.plan.applied[0].first == "Qwen3RMSNorm.forward");
  CHECK(out.plan.applied[0].second == "rms_norm_slot -> rms_norm/standard");
  REQUIRE(out.plan.guarded_targets.size() == 1);
  CHECK(out.plan.guarded_targets[0].first == "Qwen3RMSNorm.forward");
  CHECK(out.plan.guarded_targets[0].second.line == 9);
  // The call text maps back to the spec value: line 10, column 15.
  const std::optional<CodeSpan>& span = out.plan.edits.at(0).code;
  REQUIRE(span.has_value());
  CHECK(out.plan.edits[0].text.substr(span->begin, span->end - span->begin) ==
        "rms_norm_slot(hidden_states, self.weight, self.variance_epsilon)");
  CHECK(span->first_line == 10);
  CHECK(span->col_shift == 5);
}

TEST_CASE("entry guard on a decorated class's RMSNorm.forward without docstring", "[guards]") {
  Outcome out = Run(kRmsNormSlot, R"(import torch
from torch import nn


@use_kernel_forward_from_hub("RMSNorm")
class Qwen3RMSNorm(nn.Module):
    def __init__(self, hidden_size, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        input_dtype = hidden_states.dtype
        return self.weight * hidden_states.to(input_dtype)
)");
  REQUIRE(out.errors == "");
  CHECK(out.text == R"(import torch
from torch import nn


@use_kernel_forward_from_hub("RMSNorm")
class Qwen3RMSNorm(nn.Module):
    def __init__(self, hidden_size, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        # patchgen: guard rms_norm_slot -> rms_norm/standard (specs/qwen3/spec.yaml:9)
        if rms_norm_slot.use_non_eager_impl:
            return rms_norm_slot(hidden_states, self.weight, self.variance_epsilon)
        input_dtype = hidden_states.dtype
        return self.weight * hidden_states.to(input_dtype)
)");
}

TEST_CASE("entry guard on the module-level apply_rotary_pos_emb", "[guards]") {
  Outcome out = Run(R"(slots:
  - name: rope_slot
    op: rotary_pos_emb
    variant: full
    guards:
      - in: apply_rotary_pos_emb
        call: rope_slot(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)
)",
                    R"(import torch


def rotate_half(x):
    """Rotates half the hidden dims of the input."""
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


@use_kernel_forward_from_hub("rotary_pos_emb")
def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    """Applies Rotary Position Embedding to the query and key tensors.

    Args:
        q (`torch.Tensor`): The query tensor.
    Returns:
        `tuple(torch.Tensor)` comprising of the query and key tensors rotated using the Rotary Position Embedding.
    """
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    q_embed = (q * cos) + (rotate_half(q) * sin)
    k_embed = (k * cos) + (rotate_half(k) * sin)
    return q_embed, k_embed
)");
  REQUIRE(out.errors == "");
  CHECK(out.text == R"(import torch


def rotate_half(x):
    """Rotates half the hidden dims of the input."""
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


@use_kernel_forward_from_hub("rotary_pos_emb")
def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    """Applies Rotary Position Embedding to the query and key tensors.

    Args:
        q (`torch.Tensor`): The query tensor.
    Returns:
        `tuple(torch.Tensor)` comprising of the query and key tensors rotated using the Rotary Position Embedding.
    """
    # patchgen: guard rope_slot -> rotary_pos_emb/full (specs/qwen3/spec.yaml:9)
    if rope_slot.use_non_eager_impl:
        return rope_slot(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    q_embed = (q * cos) + (rotate_half(q) * sin)
    k_embed = (k * cos) + (rotate_half(k) * sin)
    return q_embed, k_embed
)");
}

const char* const kMoe = R"(import torch
from torch import nn


@use_experts_implementation
class Qwen3MoeExperts(nn.Module):
    """Collection of expert weights stored as 3D tensors."""

    def __init__(self, config):
        super().__init__()
        self.num_experts = config.num_experts
        self.act_fn = ACT2FN[config.hidden_act]

    @torch.compiler.disable
    def forward(
        self,
        hidden_states: torch.Tensor,
        top_k_index: torch.Tensor,
        top_k_weights: torch.Tensor,
    ) -> torch.Tensor:
        final_hidden_states = torch.zeros_like(hidden_states)
        with torch.no_grad():
            expert_mask = torch.nn.functional.one_hot(top_k_index, num_classes=self.num_experts)
            expert_mask = expert_mask.permute(2, 1, 0)
            expert_hit = torch.greater(expert_mask.sum(dim=(-1, -2)), 0).nonzero()

        for expert_idx in expert_hit:
            expert_idx = expert_idx[0]
            if expert_idx == self.num_experts:
                continue
            top_k_pos, token_idx = torch.where(expert_mask[expert_idx])
            current_state = hidden_states[token_idx]
            final_hidden_states.index_add_(0, token_idx, current_state.to(final_hidden_states.dtype))

        return final_hidden_states
)";

TEST_CASE("entry guard on a decorated MoE experts forward", "[guards]") {
  Outcome out = Run(R"(slots:
  - name: moe_slot
    op: moe
    variant: standard
    guards:
      - in: Qwen3MoeExperts.forward
        call: moe_slot(self, hidden_states, top_k_index, top_k_weights)
)",
                    kMoe);
  REQUIRE(out.errors == "");
  std::string expected = kMoe;
  std::string anchor = "        final_hidden_states = torch.zeros_like(hidden_states)\n";
  expected.insert(expected.find(anchor),
                  "        # patchgen: guard moe_slot -> moe/standard (specs/qwen3/spec.yaml:9)\n"
                  "        if moe_slot.use_non_eager_impl:\n"
                  "            return moe_slot(self, hidden_states, top_k_index, top_k_weights)\n");
  CHECK(out.text == expected);
}

const char* const kCausalLm =
    R"(class Qwen3MoeForCausalLM(Qwen3MoePreTrainedModel, GenerationMixin):
    def __init__(self, config):
        super().__init__(config)
        self.model = Qwen3MoeModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    @can_return_tuple
    @auto_docstring
    def forward(
        self,
        input_ids=None,
        labels=None,
        output_router_logits=None,
        logits_to_keep=0,
        **kwargs,
    ):
        r"""
        labels (`torch.LongTensor` of shape `(batch_size, sequence_length)`, *optional*):
            Labels for computing the masked language modeling loss.
        """
        outputs = self.model(input_ids=input_ids, output_router_logits=output_router_logits, **kwargs)

        hidden_states = outputs.last_hidden_state
        # Only compute necessary logits, and do not upcast them to float if we are not computing the loss
        slice_indices = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        logits = self.lm_head(hidden_states[:, slice_indices, :])

        loss = None
        if labels is not None:
            loss = self.loss_function(logits, labels, self.vocab_size, **kwargs)

        aux_loss = None
        if output_router_logits:
            aux_loss = load_balancing_loss_func(
                outputs.router_logits,
                self.num_experts,
                self.num_experts_per_tok,
                attention_mask,
            )
            if labels is not None:
                loss += self.router_aux_loss_coef * aux_loss.to(loss.device)  # make sure to reside in the same device

        return MoeCausalLMOutputWithPast(loss=loss, aux_loss=aux_loss, logits=logits)
)";

TEST_CASE("call-site guard: causal-LM logits through the labels block", "[guards]") {
  Outcome out = Run(R"(slots:
  - name: causal_lm_loss_slot
    op: cross_entropy_loss
    variant: causal
    guards:
      - in: Qwen3MoeForCausalLM.forward
        at: "logits = self.lm_head("
        through: "if labels is not None:"
        call: |
          logits, loss = causal_lm_loss_slot(self, hidden_states[:, slice_indices, :], labels, **kwargs)
)",
                    kCausalLm);
  REQUIRE(out.errors == "");
  std::string expected = kCausalLm;
  std::string before =
      "        logits = self.lm_head(hidden_states[:, slice_indices, :])\n"
      "\n"
      "        loss = None\n"
      "        if labels is not None:\n"
      "            loss = self.loss_function(logits, labels, self.vocab_size, **kwargs)\n";
  std::string after =
      "        # patchgen: guard causal_lm_loss_slot -> cross_entropy_loss/causal "
      "(specs/qwen3/spec.yaml:9)\n"
      "        if causal_lm_loss_slot.use_non_eager_impl:\n"
      "            logits, loss = causal_lm_loss_slot(self, hidden_states[:, slice_indices, :], "
      "labels, **kwargs)\n"
      "        else:\n"
      "            logits = self.lm_head(hidden_states[:, slice_indices, :])\n"
      "\n"
      "            loss = None\n"
      "            if labels is not None:\n"
      "                loss = self.loss_function(logits, labels, self.vocab_size, **kwargs)\n";
  REQUIRE(expected.find(before) != std::string::npos);
  expected.replace(expected.find(before), before.size(), after);
  CHECK(out.text == expected);
  // The call text maps back to the spec: line 13, where `logits` is at column 11.
  REQUIRE(out.plan.edits.size() == 1);
  const std::optional<CodeSpan>& span = out.plan.edits[0].code;
  REQUIRE(span.has_value());
  CHECK(out.plan.edits[0].text.substr(span->begin, span->end - span->begin) ==
        "            logits, loss = causal_lm_loss_slot(self, hidden_states[:, slice_indices, :], "
        "labels, **kwargs)");
  CHECK(span->first_line == 13);
  CHECK(span->col_shift == 2);
}

TEST_CASE("call-site guard: load-balancing loss inside `if output_router_logits:`", "[guards]") {
  Outcome out = Run(R"(slots:
  - name: aux_loss_slot
    op: load_balancing_loss
    variant: standard
    guards:
      - in: Qwen3MoeForCausalLM.forward
        at: "aux_loss = load_balancing_loss_func("
        call: |
          aux_loss = aux_loss_slot(
              outputs.router_logits, self.num_experts, self.num_experts_per_tok, attention_mask
          )
)",
                    kCausalLm);
  REQUIRE(out.errors == "");
  std::string expected = kCausalLm;
  std::string before =
      "            aux_loss = load_balancing_loss_func(\n"
      "                outputs.router_logits,\n"
      "                self.num_experts,\n"
      "                self.num_experts_per_tok,\n"
      "                attention_mask,\n"
      "            )\n";
  std::string after =
      "            # patchgen: guard aux_loss_slot -> load_balancing_loss/standard "
      "(specs/qwen3/spec.yaml:9)\n"
      "            if aux_loss_slot.use_non_eager_impl:\n"
      "                aux_loss = aux_loss_slot(\n"
      "                    outputs.router_logits, self.num_experts, self.num_experts_per_tok, "
      "attention_mask\n"
      "                )\n"
      "            else:\n"
      "                aux_loss = load_balancing_loss_func(\n"
      "                    outputs.router_logits,\n"
      "                    self.num_experts,\n"
      "                    self.num_experts_per_tok,\n"
      "                    attention_mask,\n"
      "                )\n";
  REQUIRE(expected.find(before) != std::string::npos);
  expected.replace(expected.find(before), before.size(), after);
  CHECK(out.text == expected);
}

TEST_CASE("two call-site guards and an entry guard in one body", "[guards]") {
  Outcome out = Run(R"(slots:
  - name: causal_lm_loss_slot
    op: cross_entropy_loss
    variant: causal
    guards:
      - in: Qwen3MoeForCausalLM.forward
        at: "logits = self.lm_head("
        through: "if labels is not None:"
        call: logits, loss = causal_lm_loss_slot(self, hidden_states[:, slice_indices, :], labels, **kwargs)
      - in: Qwen3MoeForCausalLM.forward
        at: "aux_loss = load_balancing_loss_func("
        call: aux_loss = causal_lm_loss_slot.aux(outputs.router_logits)
      - in: Qwen3MoeForCausalLM.forward
        call: causal_lm_loss_slot.whole(self, input_ids, labels)
)",
                    kCausalLm);
  REQUIRE(out.errors == "");
  CHECK(out.plan.edits.size() == 3);
  CHECK(out.text.find("        # patchgen: guard causal_lm_loss_slot -> cross_entropy_loss/causal "
                      "(specs/qwen3/spec.yaml:16)\n"
                      "        if causal_lm_loss_slot.use_non_eager_impl:\n"
                      "            return causal_lm_loss_slot.whole(self, input_ids, labels)\n"
                      "        outputs = self.model(") != std::string::npos);
  CHECK(out.text.find("        else:\n            logits = self.lm_head(") != std::string::npos);
  CHECK(
      out.text.find("            else:\n                aux_loss = load_balancing_loss_func(\n") !=
      std::string::npos);
}

TEST_CASE("moved lines inside a multi-line string keep their bytes", "[guards]") {
  Outcome out =
      Run(R"(slots:
  - name: s
    op: o
    variant: v
    guards:
      - in: f
        at: "x = g("
        call: x = s()
)",
          "def f():\n    x = g(\n        \"\"\"\nraw\n  text\n\"\"\",\n    )\n    return x\n");
  REQUIRE(out.errors == "");
  CHECK(out.text ==
        "def f():\n"
        "    # patchgen: guard s -> o/v (specs/qwen3/spec.yaml:9)\n"
        "    if s.use_non_eager_impl:\n"
        "        x = s()\n"
        "    else:\n"
        "        x = g(\n"
        "            \"\"\"\nraw\n  text\n\"\"\",\n"
        "        )\n"
        "    return x\n");
}

TEST_CASE("entry guard on a nested-class method", "[guards]") {
  Outcome out =
      Run(R"(slots:
  - name: s
    op: o
    variant: v
    guards:
      - in: Outer.Inner.m
        call: s(self, x)
)",
          "class Outer:\n    class Inner:\n        def m(self, x):\n            return x\n\n"
          "    def m(self, x):\n        return x\n");
  REQUIRE(out.errors == "");
  CHECK(out.text ==
        "class Outer:\n    class Inner:\n        def m(self, x):\n"
        "            # patchgen: guard s -> o/v (specs/qwen3/spec.yaml:9)\n"
        "            if s.use_non_eager_impl:\n"
        "                return s(self, x)\n"
        "            return x\n\n"
        "    def m(self, x):\n        return x\n");
}

TEST_CASE("entry guard goes before a body's leading comment", "[guards]") {
  Outcome out = Run(R"(slots:
  - name: s
    op: o
    variant: v
    guards:
      - in: f
        call: s(x)
)",
                    "def f(x):\n    # upcast first\n    y = x.float()\n    return y\n");
  REQUIRE(out.errors == "");
  CHECK(out.text ==
        "def f(x):\n"
        "    # patchgen: guard s -> o/v (specs/qwen3/spec.yaml:9)\n"
        "    if s.use_non_eager_impl:\n"
        "        return s(x)\n"
        "    # upcast first\n    y = x.float()\n    return y\n");
}

TEST_CASE("entry guard expands an inline body", "[guards]") {
  Outcome out = Run(R"(slots:
  - name: s
    op: o
    variant: v
    guards:
      - in: f
        call: |
          s(
              x,
          )
)",
                    "def f(x): return x\n");
  REQUIRE(out.errors == "");
  CHECK(out.text ==
        "def f(x):\n"
        "    # patchgen: guard s -> o/v (specs/qwen3/spec.yaml:9)\n"
        "    if s.use_non_eager_impl:\n"
        "        return s(\n"
        "            x,\n"
        "        )\n"
        "    return x\n");
}

TEST_CASE("instance scope binds in __init__ and guards use self", "[guards]") {
  Outcome out = Run(R"(slots:
  - name: moe_slot
    op: moe
    variant: standard
    scope: instance
    guards:
      - in: Qwen3MoeExperts.forward
        call: moe_slot(self, hidden_states, top_k_index, top_k_weights)
)",
                    kMoe);
  REQUIRE(out.errors == "");
  std::string expected = kMoe;
  std::string init_end = "        self.act_fn = ACT2FN[config.hidden_act]\n";
  expected.insert(expected.find(init_end) + init_end.size(),
                  "        # patchgen: instance slots moe_slot (specs/qwen3/spec.yaml:5)\n"
                  "        self.moe_slot = OpSlot(\"moe\", \"standard\").bind_from(config, "
                  "owner=self)\n");
  std::string anchor = "        final_hidden_states = torch.zeros_like(hidden_states)\n";
  expected.insert(
      expected.find(anchor),
      "        # patchgen: guard moe_slot -> moe/standard (specs/qwen3/spec.yaml:10)\n"
      "        if self.moe_slot.use_non_eager_impl:\n"
      "            return self.moe_slot(self, hidden_states, top_k_index, top_k_weights)\n");
  CHECK(out.text == expected);
  CHECK(out.plan.declarations == "from opslot import OpSlot\n");
}

TEST_CASE("instance scope expands an inline __init__ and keeps explicit self.<slot>", "[guards]") {
  Outcome out = Run(R"(slots:
  - name: s
    op: o
    variant: v
    scope: instance
    guards:
      - in: Outer.Inner.forward
        at: "y = x"
        call: y = self.s(x, s=1)
)",
                    "class Outer:\n    class Inner(Base):\n        def __init__(self, config): "
                    "super().__init__()\n\n"
                    "        def forward(self, x):\n            y = x\n            return y\n");
  REQUIRE(out.errors == "");
  CHECK(out.text ==
        "class Outer:\n    class Inner(Base):\n        def __init__(self, config):\n"
        "            super().__init__()\n"
        "            # patchgen: instance slots s (specs/qwen3/spec.yaml:5)\n"
        "            self.s = OpSlot(\"o\", \"v\").bind_from(config, owner=self)\n\n"
        "        def forward(self, x):\n"
        "            # patchgen: guard s -> o/v (specs/qwen3/spec.yaml:10)\n"
        "            if self.s.use_non_eager_impl:\n"
        "                y = self.s(x, s=1)\n"
        "            else:\n"
        "                y = x\n"
        "            return y\n");
}

TEST_CASE("identical slot declarations are emitted once", "[guards]") {
  Outcome out =
      Run(kRmsNormSlot, kRmsNormDoc, [](spec::PatchSpec& s) { s.slots.push_back(s.slots[0]); });
  REQUIRE(out.errors == "");
  CHECK(out.plan.declarations ==
        "from opslot import OpSlot\n\nrms_norm_slot = OpSlot(\"rms_norm\", \"standard\")\n");
  CHECK(out.plan.edits.size() == 1);
}

// ---- errors ------------------------------------------------------------------------------------

TEST_CASE("unknown guard target suggests a method", "[guards]") {
  Outcome out = Run(R"(slots:
  - name: rms_norm_slot
    op: rms_norm
    variant: standard
    guards:
      - in: Qwen3RMSNorm.fowrard
        call: rms_norm_slot(hidden_states, self.weight, self.variance_epsilon)
      - in: Qwen3RMSNrom.forward
        call: rms_norm_slot(hidden_states, self.weight, self.variance_epsilon)
)",
                    kRmsNormDoc);
  CHECK(out.errors ==
        "specs/qwen3/spec.yaml:9:13: error: no method 'fowrard' in class 'Qwen3RMSNorm'\n"
        "    9 |       - in: Qwen3RMSNorm.fowrard\n"
        "      |             ^~~~~~~~~~~~~~~~~~~~\n"
        "help: did you mean 'forward'? Methods of Qwen3RMSNorm: __init__, forward\n"
        "specs/qwen3/spec.yaml:11:13: error: no class or function 'Qwen3RMSNrom' in "
        "modeling_qwen3.py\n"
        "   11 |       - in: Qwen3RMSNrom.forward\n"
        "      |             ^~~~~~~~~~~~~~~~~~~~\n"
        "help: did you mean 'Qwen3RMSNorm'?\n");
}

TEST_CASE("missing `at` lists the closest statements", "[guards]") {
  Outcome out = Run(R"(slots:
  - name: causal_lm_loss_slot
    op: cross_entropy_loss
    variant: causal
    guards:
      - in: Qwen3MoeForCausalLM.forward
        at: "logits = self.lm_haed("
        call: logits = causal_lm_loss_slot(self, hidden_states)
)",
                    kCausalLm);
  CHECK(
      out.errors ==
      "specs/qwen3/spec.yaml:10:13: error: no statement in Qwen3MoeForCausalLM.forward starts with "
      "'logits = self.lm_haed('\n"
      "   10 |         at: \"logits = self.lm_haed(\"\n"
      "      |             ^~~~~~~~~~~~~~~~~~~~~~~~\n"
      "note: closest statements in Qwen3MoeForCausalLM.forward (modeling_qwen3.py):\n"
      "note: line 27: logits = self.lm_head(hidden_states[:, slice_indices, :])\n"
      "note: line 22: outputs = self.model(input_ids=input_ids, "
      "output_router_logits=output_router_logits, **kwargs)\n"
      "note: line 31: loss = self.loss_function(logits, labels, self.vocab_size, **kwargs)\n"
      "note: line 42: loss += self.router_aux_loss_coef * aux_loss.to(loss.device)  # make sure to "
      "reside in the same device\n"
      "note: line 29: loss = None\n"
      "note: line 35: aux_loss = load_balancing_loss_func(\n"
      "note: line 26: slice_indices = slice(-logits_to_keep, None) if isinstance(logits_to_keep, "
      "int) else logits_to_keep\n"
      "note: line 33: aux_loss = None\n"
      "note: ... (6 more)\n"
      "help: `at` is the leading text of one statement, after its indentation; copy it from the "
      "upstream line\n");
}

TEST_CASE("ambiguous `at` lists every match", "[guards]") {
  Outcome out = Run(R"(slots:
  - name: causal_lm_loss_slot
    op: cross_entropy_loss
    variant: causal
    guards:
      - in: Qwen3MoeForCausalLM.forward
        at: "if labels"
        call: loss = causal_lm_loss_slot(self, hidden_states)
)",
                    kCausalLm);
  CHECK(out.errors ==
        "specs/qwen3/spec.yaml:10:13: error: 'if labels' matches 2 statements in "
        "Qwen3MoeForCausalLM.forward\n"
        "   10 |         at: \"if labels\"\n"
        "      |             ^~~~~~~~~~~\n"
        "note: line 30: if labels is not None:\n"
        "note: line 41: if labels is not None:\n"
        "help: make `at` longer so that it matches exactly one statement\n");
}

TEST_CASE("`through` must be a later sibling of `at`", "[guards]") {
  Outcome out = Run(R"(slots:
  - name: aux_loss_slot
    op: load_balancing_loss
    variant: standard
    guards:
      - in: Qwen3MoeForCausalLM.forward
        at: "aux_loss = load_balancing_loss_func("
        through: "return MoeCausalLMOutputWithPast("
        call: aux_loss = aux_loss_slot(outputs.router_logits)
)",
                    kCausalLm);
  CHECK(
      out.errors ==
      "specs/qwen3/spec.yaml:11:18: error: `through` statement (line 44) is not a later sibling of "
      "the `at` statement (line 35) in Qwen3MoeForCausalLM.forward\n"
      "   11 |         through: \"return MoeCausalLMOutputWithPast(\"\n"
      "      |                  ^~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~\n"
      "note: `at` is line 35: aux_loss = load_balancing_loss_func(\n"
      "note: line 44: return MoeCausalLMOutputWithPast(loss=loss, aux_loss=aux_loss, "
      "logits=logits)\n"
      "help: `at` and `through` must be statements of the same block, `through` at or after "
      "`at`\n");
}

TEST_CASE("`through` that matches nothing lists the statements after `at`", "[guards]") {
  Outcome out = Run(R"(slots:
  - name: aux_loss_slot
    op: load_balancing_loss
    variant: standard
    guards:
      - in: Qwen3MoeForCausalLM.forward
        at: "aux_loss = None"
        through: "if output_router_logit:"
        call: aux_loss = aux_loss_slot(outputs.router_logits)
)",
                    kCausalLm);
  CHECK(
      out.errors ==
      "specs/qwen3/spec.yaml:11:18: error: no statement in Qwen3MoeForCausalLM.forward after line "
      "33 "
      "starts with 'if output_router_logit:'\n"
      "   11 |         through: \"if output_router_logit:\"\n"
      "      |                  ^~~~~~~~~~~~~~~~~~~~~~~~~\n"
      "note: closest statements in Qwen3MoeForCausalLM.forward after line 33 (modeling_qwen3.py):\n"
      "note: line 34: if output_router_logits:\n"
      "note: line 33: aux_loss = None\n"
      "note: line 44: return MoeCausalLMOutputWithPast(loss=loss, aux_loss=aux_loss, "
      "logits=logits)\n"
      "help: `through` is the leading text of one statement, after its indentation; copy it from "
      "the "
      "upstream line\n");
}

TEST_CASE("conflicting slot declarations", "[guards]") {
  Outcome out = Run(kRmsNormSlot, kRmsNormDoc, [](spec::PatchSpec& s) {
    spec::Slot other = s.slots[0];
    other.variant = "offset";
    other.loc.line = 20;
    other.loc.source_line = "  - name: rms_norm_slot   # from the parent spec";
    s.slots.push_back(other);
  });
  CHECK(out.errors ==
        "specs/qwen3/spec.yaml:20:11: error: conflicting declarations of slot 'rms_norm_slot': "
        "OpSlot(\"rms_norm\", \"offset\") here, OpSlot(\"rms_norm\", \"standard\") before\n"
        "   20 |   - name: rms_norm_slot   # from the parent spec\n"
        "      |           ^~~~~~~~~~~~~\n"
        "specs/qwen3/spec.yaml:5:11: note: 'rms_norm_slot' first declared here\n"
        "help: a slot name means one op/variant; rename one of the slots or make them identical\n");
}

TEST_CASE("instance scope needs a method of a class with __init__(config)", "[guards]") {
  Outcome out =
      Run(R"(slots:
  - name: s
    op: o
    variant: v
    scope: instance
    guards:
      - in: f
        call: s(x)
      - in: NoInit.forward
        call: s(x)
      - in: NoConfig.forward
        call: s(x)
)",
          "def f(x):\n    return x\n\n\nclass NoInit(Base):\n    def forward(self, x):\n        "
          "return x\n\n\n"
          "class NoConfig:\n    def __init__(self, hidden_size):\n        self.h = hidden_size\n\n"
          "    def forward(self, x):\n        return x\n");
  CHECK(out.errors ==
        "specs/qwen3/spec.yaml:10:13: error: slot 's' has `scope: instance`, but 'f' is a "
        "module-level "
        "function, not a method\n"
        "   10 |       - in: f\n"
        "      |             ^\n"
        "help: instance-scoped slots live on `self`; guard a method, or drop `scope: instance`\n"
        "specs/qwen3/spec.yaml:12:13: error: slot 's' has `scope: instance`, but class 'NoInit' "
        "has no "
        "__init__ to bind it in\n"
        "   12 |       - in: NoInit.forward\n"
        "      |             ^~~~~~~~~~~~~~\n"
        "help: instance-scoped slots are bound in the owner's __init__; drop `scope: instance` or "
        "guard "
        "a method of a class that defines __init__\n"
        "specs/qwen3/spec.yaml:14:13: error: slot 's' has `scope: instance`, but NoConfig.__init__ "
        "has "
        "no `config` parameter to bind from\n"
        "   14 |       - in: NoConfig.forward\n"
        "      |             ^~~~~~~~~~~~~~~~\n"
        "help: the binding is `self.s = OpSlot(\"o\", \"v\").bind_from(config, owner=self)`; drop "
        "`scope: "
        "instance` "
        "or guard a class whose __init__ takes the config\n");
}

TEST_CASE("entry guard call must be one expression", "[guards]") {
  Outcome out = Run(R"(slots:
  - name: s
    op: o
    variant: v
    guards:
      - in: f
        call: |
          y = s(x)
          y
)",
                    "def f(x):\n    return x\n");
  CHECK(
      out.errors ==
      "specs/qwen3/spec.yaml:12:11: error: an entry guard's `call` must be a single expression\n"
      "   12 |           y\n"
      "      |           ^\n"
      "help: it becomes `return <call>`; to run statements instead, add `at:` to make a call-site "
      "guard\n");
}

TEST_CASE("call that does not parse", "[guards]") {
  Outcome out = Run(R"(slots:
  - name: s
    op: o
    variant: v
    guards:
      - in: f
        call: s(x
      - in: f
        at: "return x"
        call: |
          y = s(x)
          return y +
)",
                    "def f(x):\n    return x\n");
  CHECK(out.errors ==
        "specs/qwen3/spec.yaml:10:15: error: `call` is not valid Python\n"
        "   10 |         call: s(x\n"
        "      |               ^~~\n"
        "help: an entry guard's `call` is one expression; it becomes `return <call>`\n"
        "specs/qwen3/spec.yaml:15:11: error: `call` is not valid Python\n"
        "   15 |           return y +\n"
        "      |           ^~~~~~~~~~\n"
        "help: a call-site guard's `call` is one or more statements\n");
}

TEST_CASE("overlapping call-site guards", "[guards]") {
  Outcome out = Run(R"(slots:
  - name: s
    op: o
    variant: v
    guards:
      - in: Qwen3MoeForCausalLM.forward
        at: "aux_loss = None"
        through: "if output_router_logits:"
        call: aux_loss = s()
      - in: Qwen3MoeForCausalLM.forward
        at: "aux_loss = load_balancing_loss_func("
        call: aux_loss = s()
)",
                    kCausalLm);
  CHECK(out.errors ==
        "specs/qwen3/spec.yaml:14:13: error: call-site guard on lines 35-40 of "
        "Qwen3MoeForCausalLM.forward "
        "overlaps another guard's lines 33-42\n"
        "   14 |         at: \"aux_loss = load_balancing_loss_func(\"\n"
        "      |             ^~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~\n"
        "specs/qwen3/spec.yaml:10:13: note: the other guard\n"
        "help: guards in one body must wrap disjoint statement ranges\n");
}

}  // namespace
}  // namespace patchgen::rewriter
