"""dtype and device: `auto` resolution, clear errors, the Target as the one source of truth, cache keys."""

import json
from types import SimpleNamespace

import pytest
import torch

from blockdraft import BlockdraftError, Target
from blockdraft.cli import main
from blockdraft.model import precision
from blockdraft.model.precision import cache_key, resolve_device, resolve_dtype, resolve_precision
from blockdraft.trees import budget


@pytest.mark.parametrize("fast_bf16,expect", [(True, torch.bfloat16), (False, torch.float32)])
def test_auto_dtype_follows_the_cpu(monkeypatch, fast_bf16, expect):
    monkeypatch.setattr(precision, "cpu_has_fast_bf16", lambda: fast_bf16)
    assert resolve_dtype("auto", torch.device("cpu")) == expect
    assert resolve_dtype("float32", "cpu") == torch.float32  # explicit names ignore the CPU
    assert resolve_dtype("bf16", "cpu") == torch.bfloat16 and resolve_dtype("float16", "cpu") == torch.float16


@pytest.mark.parametrize("flags,expect", [("fpu sse avx512f amx_bf16 amx_tile", True),
                                          ("fpu sse avx512f avx512_bf16", True), ("fpu sse avx2 avx512f", False)])
def test_bf16_capability_falls_back_to_cpuinfo_flags(monkeypatch, tmp_path, flags, expect):
    for name in precision.BF16_PROBES:  # torch's own probes say no: the flags decide
        monkeypatch.setattr(torch.cpu, name, lambda: False, raising=False)
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nflags\t\t: {flags}\n")
    monkeypatch.setattr(precision, "CPUINFO", cpuinfo)
    assert precision.cpu_has_fast_bf16() is expect
    monkeypatch.setattr(torch.cpu, precision.BF16_PROBES[0], lambda: True, raising=False)
    assert precision.cpu_has_fast_bf16() is True  # AMX reported by torch


def test_auto_on_cuda_is_bf16_without_code_changes(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert resolve_precision("auto", "auto") == (torch.bfloat16, torch.device("cuda", 0))
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    with pytest.raises(BlockdraftError, match="has 2 GPU"):
        resolve_device("cuda:2")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert resolve_dtype("auto", torch.device("cuda", 0)) == torch.float16


def test_bad_dtype_or_device_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    with pytest.raises(BlockdraftError, match="CUDA is not available"):
        resolve_device("cuda")
    with pytest.raises(BlockdraftError, match="unknown device 'tpu'"):
        resolve_device("tpu")
    with pytest.raises(BlockdraftError, match="unknown dtype 'int8'"):
        resolve_dtype("int8")
    with pytest.raises(BlockdraftError, match="unsupported dtype"):
        resolve_dtype(torch.int8)


@pytest.mark.parametrize("command", ["generate", "bench", "analyze", "train"])
@pytest.mark.parametrize("flag,value,message", [("--device", "cuda", "CUDA is not available"),
                                                ("--dtype", "int8", "unknown dtype 'int8'")])
def test_cli_refuses_bad_precision_in_one_line(monkeypatch, tiny_model_dir, capsys, command, flag, value, message):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    args = {"generate": ["generate", "hi"], "bench": ["bench", "--methods", "ar"], "analyze": ["analyze"],
            "train": ["train", "--drafter", "bpd", "--out", "unused"]}[command]
    assert main([*args, "--target", str(tiny_model_dir), flag, value]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("blockdraft: error: ") and message in err and len(err.splitlines()) == 1


def test_target_carries_dtype_and_device_into_json_and_stats(tiny_model_dir, capsys):
    target = Target.load(str(tiny_model_dir), dtype="bfloat16", device="cpu")
    assert target.dtype == torch.bfloat16 and target.device == torch.device("cpu")
    assert target.model.dtype == torch.bfloat16  # one source of truth: the model's own weights
    rc = main(["generate", "abc abc", "--target", str(tiny_model_dir), "--dtype", "bfloat16", "--device", "cpu",
               "--max-new-tokens", "6", "--no-chat-template", "--json", "--stats"])
    assert rc == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert out["dtype"] == "bfloat16" and out["device"] == "cpu"
    assert "bfloat16 on cpu" in captured.err


def test_python_api_takes_dtype_and_refuses_a_second_one(tiny_model_dir, tiny_target):
    import blockdraft

    res = blockdraft.generate("abc abc", method="lookup", target=str(tiny_model_dir), max_new_tokens=4,
                              chat_template=False, dtype="float32", device="cpu")
    assert len(res.tokens) >= 1
    assert blockdraft.load_target(str(tiny_model_dir), "float32", "cpu").dtype == torch.float32
    assert blockdraft.load_target(str(tiny_model_dir), "bfloat16").dtype == torch.bfloat16
    with pytest.raises(BlockdraftError, match="already loaded in torch.float32"):
        blockdraft.generate([5, 6, 7], target=tiny_target, max_new_tokens=2, dtype="bfloat16")


def test_cost_curve_cache_is_keyed_by_target_dtype_device_threads_and_processor(tmp_path, monkeypatch):
    monkeypatch.setenv("BLOCKDRAFT_CACHE", str(tmp_path))
    measured = []

    def fake_measure(target):
        measured.append(cache_key(target))
        return budget.CostCurve({128: {0: 1.0, 16: 1.0 + len(measured)}, 1024: {0: 1.0, 16: 2.0 + len(measured)}})

    monkeypatch.setattr(budget, "measure_cost_curve", fake_measure)

    def target(name="t", dtype=torch.float32, device="cpu"):
        return SimpleNamespace(name=name, dtype=dtype, device=torch.device(device))

    monkeypatch.setattr(precision, "processor", lambda device: "GPU" if device.type == "cuda" else "CPU A")
    first = budget.cost_curve(target())
    assert budget.cost_curve(target()) == first and len(measured) == 1  # same key: the cached file is reused
    variants = [target(dtype=torch.bfloat16), target(device="cuda:0"), target(name="u")]
    curves = [budget.cost_curve(t) for t in variants]
    monkeypatch.setattr(precision, "processor", lambda device: "CPU B")  # the same VM on another chip
    curves.append(budget.cost_curve(target()))
    monkeypatch.setattr(precision, "processor", lambda device: "CPU A")
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1 if threads != 1 else 2)
        curves.append(budget.cost_curve(target()))
    finally:
        torch.set_num_threads(threads)
    assert len(measured) == 6 and len(set(measured)) == 6  # every change of key measured anew
    files = sorted(p.name for p in (tmp_path / "cost").iterdir())
    assert len(files) == 6 and any("bfloat16" in f for f in files) and any("cuda0" in f for f in files)
    assert all(c != first for c in curves)
    assert budget.cost_curve(target(dtype=torch.bfloat16)) == curves[0] and len(measured) == 6  # reused


@pytest.mark.parametrize("costs", [{1: 1.0, 2: 1.2, 5: 1.5, 17: 2.0},  # ms per pass of a tree of n nodes
                                   {1: 1.0, 2: 1.5, 5: 1.2, 17: 2.0}])  # 4 drafts measured cheaper than 1
def test_measured_cost_curve_takes_each_sizes_fastest_run_and_never_falls(tiny_target, virtual_clock, monkeypatch,
                                                                          costs):
    """On a virtual clock (measure_cost_at reads its `time`): verifying a tree of n nodes takes costs[n] ms, and
    every 3rd pass 10 ms more, as a burst of load would. Each size's fastest run is its cost, whatever the bursts
    hit, and a bigger tree never costs less than a smaller one."""
    from conftest import MEASURE_COST_AT  # the real measurement (the session's curves are modelled)

    virtual_clock.install(monkeypatch, budget)
    real_verify, calls = tiny_target.verify, []

    def timed_verify(tree):
        calls.append(len(tree))
        virtual_clock.advance((costs[len(tree)] + (10.0 if len(calls) % 3 == 0 else 0.0)) / 1000)
        return real_verify(tree)

    monkeypatch.setattr(tiny_target, "verify", timed_verify)
    curve = MEASURE_COST_AT(tiny_target, sizes=(0, 1, 4, 16), reps=5)
    running_max = {b: max(costs[c + 1] for c in (0, 1, 4, 16) if c <= b) for b in (0, 1, 4, 16)}
    assert curve == pytest.approx(running_max)
    assert len(set(calls[:4])) == 4  # sizes are timed in turns, not one after another


def test_cost_curve_measured_at_other_sizes_is_measured_again(tmp_path, monkeypatch):
    """A cached curve without the sizes on both sides of a tile step (an older file) must not be reused."""
    monkeypatch.setenv("BLOCKDRAFT_CACHE", str(tmp_path))
    measured = []

    def fake_measure(target):
        measured.append(1)
        return budget.CostCurve({128: {b: 1.0 + b / 100 for b in budget.SIZES}})

    monkeypatch.setattr(budget, "measure_cost_curve", fake_measure)
    target = SimpleNamespace(name="t", dtype=torch.float32, device=torch.device("cpu"))
    path = budget.cost_curve_path(target)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"by_context": {"128": {"0": 1.0, "12": 1.1, "16": 1.3}}}))  # the old sizes
    curve = budget.cost_curve(target)
    assert measured == [1] and 15 in curve.at(128)
    assert budget.cost_curve(target) == curve and measured == [1]  # the new file is reused
