"""Int8 copies of drafter weights (model/packing.py): few-row calls read them, larger calls and the target
never do, `auto` picks large float32 weights, and decoding with them stays lossless."""

import pytest
import torch
from test_bf16_methods import drafter_modules

from blockdraft import SpeculativeDecoder, methods
from blockdraft.errors import BlockdraftError
from blockdraft.methods import make_drafter
from blockdraft.model import packing

TOKENS = 24


@pytest.fixture(autouse=True)
def shipped(checkpoints, monkeypatch):
    monkeypatch.setattr(methods, "CHECKPOINTS", checkpoints)  # every method loads by its bare name


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int8_copy_serves_few_row_calls_only(dtype):
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 96, bias=True).to(dtype)
    ref = torch.nn.Linear(64, 96, bias=True).to(dtype)
    ref.load_state_dict(lin.state_dict())
    packing.prepack_linears(lin, int8=True)
    packing.prepack_linears(ref)
    q, scales = lin._int8
    dequant = q.float() * scales.float()[:, None]
    # rounding to the nearest step of its row: at most half a step off (a little more: the scale is rounded)
    assert ((dequant - lin.weight.float()).abs() <= 0.6 * scales.float()[:, None]).all()
    rows = packing.INT8_MAX_ROWS[dtype]
    with torch.inference_mode():
        few = torch.randn(rows, 64, dtype=dtype)
        # the kernel reads the activations in bf16
        expected = few.bfloat16().float() @ dequant.T + lin.bias.float()
        out = lin(few)
        assert out.dtype == dtype and out.shape == (rows, 96)
        assert torch.allclose(out.float(), expected, atol=0.05, rtol=0.02)
        assert not torch.equal(out, ref(few))  # the int8 copy was read, not the weight
        batched = torch.randn(2, rows // 2, 64, dtype=dtype)  # leading dims are flattened and restored
        assert torch.allclose(lin(batched), lin(batched.reshape(rows, 64)).reshape(2, rows // 2, 96))
        many = torch.randn(rows + 1, 64, dtype=dtype)
        assert torch.equal(lin(many), ref(many))
    with torch.no_grad():  # outside inference mode (training, feature extraction): the exact weight
        assert torch.equal(lin(few.clone()), ref(few.clone()))


def test_auto_quantizes_only_large_float32_weights():
    big = torch.nn.Linear(576, 1536, bias=False)  # one of SmolLM2's drafter MLP weights: 884k elements
    small = torch.nn.Linear(64, 96)
    big_bf16 = torch.nn.Linear(576, 1536, bias=False).to(torch.bfloat16)
    for module in (big, small, big_bf16):
        packing.prepack_linears(module, int8="auto")
    assert big._int8 is not None
    assert small._int8 is None and big_bf16._int8 is None  # in cache anyway; no gain measured on AMX in bf16
    off = torch.nn.Linear(576, 1536, bias=False)
    packing.prepack_linears(off, int8=False)
    assert off._int8 is None


@pytest.mark.parametrize("method", ["bpd", "dflash", "hydra", "treeflash:budget=12", "hybrid"])
def test_int8_drafters_stay_lossless_and_leave_the_target_alone(tiny, method):
    """Drafts from int8 weights may differ; the output must not (float32: token for token)."""
    prompts = [tiny.encode(p, chat_template=False) for p in ("tell me more now\n", "abcab abcab abc")]
    before = {k: v.clone() for k, v in tiny.model.state_dict().items()}
    exact, quantized = make_drafter(method, tiny, int8=False), make_drafter(f"{method}:int8=true", tiny)
    linears = [m for m in drafter_modules(quantized) if isinstance(m, torch.nn.Linear)]
    assert linears and all(m._int8 is not None for m in linears)
    for prompt in prompts:
        ar = SpeculativeDecoder(tiny, make_drafter("ar", tiny)).generate(prompt, TOKENS)
        ref = SpeculativeDecoder(tiny, exact).generate(prompt, TOKENS)
        res = SpeculativeDecoder(tiny, quantized).generate(prompt, TOKENS)
        assert res.tokens == ar.tokens == ref.tokens
        assert res.stats.tree_nodes > res.stats.target_calls  # drafts were verified, not just roots
    assert all(not hasattr(m, "_int8") for m in tiny.model.modules())  # the target is never quantized
    assert all(torch.equal(v, before[k]) for k, v in tiny.model.state_dict().items())


def test_int8_option_is_checked(tiny):
    with pytest.raises(BlockdraftError, match="int8 must be true, false or auto"):
        make_drafter("hydra:int8=2", tiny)
