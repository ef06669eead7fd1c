"""repro.common.hooks: capture and hooked (users: papers 02, 04, 06, 09, 10), checked against calling the
submodules directly."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from repro.common.hooks import capture, hooked


class Pair(nn.Module):
    """Returns a tuple, as decoder layers do: (the transformed input, an extra)."""

    def __init__(self, d: int):
        super().__init__()
        self.lin = nn.Linear(d, d)

    def forward(self, x):
        return torch.tanh(self.lin(x)), x.sum()


class Net(nn.Module):
    def __init__(self, d: int = 5):
        super().__init__()
        self.inp = nn.Linear(3, d)
        self.pair = Pair(d)
        self.out = nn.Linear(d, 2)

    def forward(self, x):
        return self.out(self.pair(torch.relu(self.inp(x)))[0])


def _n_hooks(model: nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


@pytest.fixture
def net():
    torch.manual_seed(0)
    return Net(), torch.randn(4, 3)


def test_capture_outputs_match_the_submodules_called_directly(net):
    model, x = net
    with capture({"inp": model.inp, "pair": model.pair, "out": model.out}) as got:
        y = model(x)
    h = torch.relu(model.inp(x))
    assert torch.equal(got["inp"], model.inp(x))
    assert torch.equal(got["pair"], model.pair(h)[0])  # a tuple output: its first element
    assert torch.equal(got["out"], y)
    assert not any(t.requires_grad for t in got.values())  # detached, although autograd was on
    assert _n_hooks(model) == 0


def test_capture_inputs_and_positional_keys(net):
    model, x = net
    with capture([model.inp, model.pair.lin, model.out], inputs=True) as got:
        model(x)
    h = torch.relu(model.inp(x))
    assert sorted(got) == [0, 1, 2]
    assert torch.equal(got[0], x)
    assert torch.equal(got[1], h)
    assert torch.equal(got[2], model.pair(h)[0])
    assert _n_hooks(model) == 0


def test_capture_keeps_the_last_call_and_sees_earlier_hooks_changes(net):
    model, x = net
    with hooked([model.inp], lambda _m, _i, out: 2 * out), capture([model.inp]) as got:
        model(x)
        model(x + 1)
    assert torch.equal(got[0], 2 * model.inp(x + 1))


def test_capture_removes_its_hooks_when_the_body_raises(net):
    model, x = net
    with pytest.raises(RuntimeError, match="boom"), capture([model.inp, model.out], inputs=True) as got:
        model(x)
        raise RuntimeError("boom")
    assert torch.equal(got[0], x)
    assert _n_hooks(model) == 0
    model(x)  # no hook left to write into the dict
    assert len(got) == 2


def test_hooked_changes_outputs_and_inputs_for_the_duration(net):
    model, x = net
    plain, at_zero = model(x), model(torch.zeros_like(x))
    with hooked([model.out], lambda _m, _i, out: out + 1):
        assert torch.equal(model(x), plain + 1)
    with hooked([model.inp], lambda _m, inp: (torch.zeros_like(inp[0]),), pre=True):
        assert torch.equal(model(x), at_zero)
    assert torch.equal(model(x), plain)
    assert _n_hooks(model) == 0


def test_hooked_prepend_runs_first(net):
    model, x = net
    order = []
    with hooked([model.out], lambda *_: order.append("old")), \
            hooked([model.out], lambda *_: order.append("new"), prepend=True):
        model(x)
    assert order == ["new", "old"]
    assert _n_hooks(model) == 0


def test_hooked_removes_its_hooks_when_the_body_raises(net):
    model, x = net
    calls = []
    with pytest.raises(ValueError), hooked([model.inp, model.out], lambda *_: calls.append(1), pre=True):
        model(x)
        raise ValueError
    assert calls == [1, 1]
    assert _n_hooks(model) == 0
    model(x)
    assert calls == [1, 1]
