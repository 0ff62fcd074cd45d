"""Override of ToyDecoderLayer.forward: same math as upstream, with an optional residual hook.

The hook (set on the layer as `residual_hook`, None by default) sees each residual before it is
added back, e.g. to offload it; with no hook the layer computes exactly what upstream computes.
"""


def decoder_layer_forward(self, hidden_states, attention_mask=None, position_embeddings=None, **kwargs):
    residual = hidden_states
    hidden_states = self.input_layernorm(hidden_states)
    hidden_states, _ = self.self_attn(
        hidden_states=hidden_states,
        attention_mask=attention_mask,
        position_embeddings=position_embeddings,
        **kwargs,
    )
    if self.residual_hook is not None:
        residual = self.residual_hook(residual)
    hidden_states = residual + hidden_states

    residual = hidden_states
    hidden_states = self.post_attention_layernorm(hidden_states)
    hidden_states = self.mlp(hidden_states)
    if self.residual_hook is not None:
        residual = self.residual_hook(residual)
    return residual + hidden_states
