def forward(self, x):
    # LlamaMLP in comments and "LlamaMLP" in strings stay as they are.
    if not isinstance(self, LlamaMLP):
        raise TypeError("expected a LlamaMLP")
    return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))
