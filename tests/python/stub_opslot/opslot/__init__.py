"""A stand-in for the `opslot` runtime, for tests of generated modules.

It has the interface generated code uses (`OpSlot(op, variant)`, `.use_non_eager_impl`, calling the
slot, `.bind_from(config, owner=self)`) and records every slot created and every call, so tests can
check that guards dispatch with exactly the arguments a spec passes. A slot is bound by `bind(fn)`;
`bind_from` binds from `config.stub_ops[op]` when the config has it (`owner` is accepted, unused).
"""

CREATED = []


class OpSlot:
    def __init__(self, op, variant):
        self.op = op
        self.variant = variant
        self.impl = None
        self.calls = []
        CREATED.append(self)

    @property
    def use_non_eager_impl(self):
        return self.impl is not None

    def bind(self, impl):
        self.impl = impl
        return self

    def bind_from(self, config, owner=None):
        impl = getattr(config, "stub_ops", {}).get(self.op)
        return self.bind(impl) if impl is not None else self

    def __call__(self, *args, **kwargs):
        if self.impl is None:
            raise RuntimeError("stub OpSlot(%r, %r) called while unbound" % (self.op, self.variant))
        self.calls.append((args, kwargs))
        return self.impl(*args, **kwargs)
