"""Bodies shared by the Toy and ToyMoe specs (ToyMoe reuses them with a name_map)."""


def count_toy_parameters(model: ToyPreTrainedModel, trainable_only: bool = False) -> int:
    """Number of (trainable) parameters of a Toy model."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


def num_parameters(self, trainable_only=False):
    """Number of (trainable) parameters of this model."""
    return count_toy_parameters(self, trainable_only)
