"""The chooser (order, forced, disabled, measured preference, kernel-failure fallback) and the humming
backend's weight hand-over, on the CPU."""

import pytest
import torch

import anybit
from anybit.backends.base import Problem
from anybit.backends.humming import humming_configs, humming_tensors
from anybit.backends.registry import choose, choose_with_reason, explain, gemm, get_backend, prepare
from anybit.errors import AnybitError, FallbackWarning, KernelFailure, Unsupported
from anybit.formats.dtypes import IntType
from anybit.formats.scheme import Scheme
from anybit.tuning.cache import backend_key, problem_key
from tests.tolerances import GEMM_REL_ERR, rel_err

CPU = torch.device("cpu")


def _problem(scheme="w4a16", m=16, n=256, k=256, dtype=torch.float16):
    return Problem(Scheme.parse(scheme), n, k, m, CPU, dtype)


def test_explain_lists_every_backend_with_a_reason(monkeypatch):
    monkeypatch.delenv("ANYBIT_BACKENDS", raising=False)
    rows = explain(_problem())
    assert [r[0] for r in rows] == ["triton", "humming", "torch"]
    humming = dict((n, (ok, why)) for n, ok, why in rows)["humming"]
    assert not humming[0] and ("not installed" in humming[1] or "CUDA" in humming[1])


def test_forced_backend_that_cannot_run_names_the_reason():
    with pytest.raises(AnybitError, match="humming"):
        choose(_problem(), "humming")
    with pytest.raises(AnybitError, match="unknown backend 'nope'"):
        choose(_problem(), "nope")


def test_disabled_and_ordered(monkeypatch):
    monkeypatch.setenv("ANYBIT_DISABLED_BACKENDS", "triton")
    assert choose(_problem()).name == "torch"
    assert ("triton", False, "disabled by ANYBIT_DISABLED_BACKENDS") in explain(_problem())


def test_measured_fastest_backend_is_preferred(tmp_path, monkeypatch, interpret):
    monkeypatch.setenv("ANYBIT_CACHE_DIR", str(tmp_path))
    from anybit.backends.triton import tuning_cache

    p = _problem()
    key = problem_key(p.scheme, p.n, p.k, p.m, p.act_dtype)
    cache = tuning_cache(CPU)
    cache.put(backend_key(key, "triton"), {}, 30.0)
    cache.put(backend_key(key, "torch"), {}, 12.0)
    name, why = choose_with_reason(p)
    assert name == "torch" and "measured fastest" in why and "torch 12.0" in why
    # another M bucket has no data: order decides
    assert choose_with_reason(_problem(m=1000))[0] == "triton"
    # a measured backend that is disabled is not picked
    monkeypatch.setenv("ANYBIT_DISABLED_BACKENDS", "torch")
    assert choose(p).name == "triton"


def test_multi_backend_routes_calls_to_the_measured_fastest(tmp_path, monkeypatch, interpret):
    monkeypatch.setenv("ANYBIT_CACHE_DIR", str(tmp_path))
    from anybit.backends.triton import tuning_cache

    qw = anybit.quantize(torch.randn(256, 256), "w4a16")
    key = problem_key(qw.scheme, 256, 256, 16, torch.float16)
    tuning_cache(CPU).put(backend_key(key, "torch"), {}, 1.0)
    tuning_cache(CPU).put(backend_key(key, "triton"), {}, 2.0)
    x = torch.randn(16, 256).half()
    p = prepare(qw)
    gemm(x, p)
    assert p.backend == "triton" and p.routes == {16: "triton"} and not p.others  # off by default
    monkeypatch.setenv("ANYBIT_MULTI_BACKEND", "1")
    p = prepare(qw)
    y = gemm(x, p)
    assert p.routes[16] == "torch" and "torch" in p.others
    assert rel_err(y, x.double() @ qw.dequantize().double().T) < GEMM_REL_ERR[torch.float16]


def test_kernel_failure_falls_back_with_one_warning(monkeypatch, interpret):
    import triton.runtime.errors as triton_errors

    from anybit.backends.triton import TritonBackend

    calls = []

    def broken(self, x, prepared, bias, config):
        calls.append(x.shape[0])
        raise triton_errors.OutOfResources(300000, 232448, "shared memory")

    monkeypatch.setattr(TritonBackend, "_gemm", broken)
    qw = anybit.quantize(torch.randn(64, 256), "w4a16")
    x = torch.randn(3, 256).half()
    p = prepare(qw)
    with pytest.warns(FallbackWarning, match="shared memory.*now run on 'torch'"):
        y = gemm(x, p)
    assert rel_err(y, x.double() @ qw.dequantize().double().T) < GEMM_REL_ERR[torch.float16]
    gemm(x, p)  # no second warning (filterwarnings turns one into an error), no second attempt
    assert calls == [3] and p.routes == {4: "torch"}
    # a forced backend does not fall back: the failure surfaces
    with pytest.raises(KernelFailure, match="OutOfResources|shared memory"):
        gemm(x, prepare(qw, backend="triton"))


SCHEMES = [
    "w4a16",
    "w4a16-zp",
    "w2a16",
    "w8a16",
    "nvfp4",
    "mxfp4",
    "mxfp6",
    "w8a16:e4m3:ch:bf16",
    "w8a8:e4m3:ch:bf16:e4m3-token",
]


@pytest.mark.parametrize("scheme", SCHEMES)
def test_humming_tensors_dequantize_to_our_values(scheme):
    """Humming's formula (code - zero or 2**(b-1) offset) * scale * scale_2, applied in torch to the
    tensors we hand over, equals dequantize()."""
    s = Scheme.parse(scheme)
    qw = anybit.quantize(torch.randn(64, 256) * 0.05, s)
    dtype = s.scale_dtype.torch_dtype if s.scale_dtype.name in ("bf16", "fp16") else torch.bfloat16
    t = humming_tensors(qw, dtype)
    wc, _ = humming_configs(s)
    if isinstance(s.weight, IntType):
        q = t["weight"].float()
        z = t["zero_point"].float() if "zero_point" in t else torch.full_like(q[:, :1], 2 ** (s.weight.bits - 1))
        gk = s.granularity.k if "group_size" in wc else qw.k
        q = q - z.repeat_interleave(gk, -1)[:, : qw.k] if z.shape[1] > 1 else q - z
    else:
        from anybit.formats.dtypes import FloatType

        assert isinstance(s.weight, FloatType)
        q = s.weight.decode(t["weight"].to(torch.uint8))
    sc = t["weight_scale"].float()
    w = q * sc.repeat_interleave(qw.k // sc.shape[1], -1)
    if "weight_scale_2" in t:
        w = w * t["weight_scale_2"]
    torch.testing.assert_close(w, qw.dequantize(), rtol=0, atol=0)


@pytest.mark.parametrize(
    "scheme,why",
    [
        ("w4a8", "fp32 group/channel scales"),
        ("fp8-block", "per-token e4m3"),
        ("w4a8:int4:g128:bf16:e4m3-g128", "per-token"),
        ("w8a8:int8:ch:bf16:int8-token", "int8-token"),
    ],
)
def test_humming_refuses_what_it_cannot_run_exactly(scheme, why):
    with pytest.raises(Unsupported, match=why):
        humming_configs(Scheme.parse(scheme))


def test_humming_backend_refuses_mismatched_scale_dtype(monkeypatch):
    import anybit.backends.humming as hb

    monkeypatch.setattr(hb, "_installed", lambda: True)
    b = get_backend("humming")
    cuda = Problem(Scheme.parse("w4a16"), 256, 256, 1, torch.device("cuda"), torch.float16)
    ok, why = b.supports(cuda)
    assert not ok and "bf16 scales with torch.float16" in why
    ok, why = b.supports(Problem(Scheme.parse("w4a16"), 256, 256, 1, torch.device("cuda"), torch.bfloat16))
    assert ok, why
    assert not b.supports(_problem())[0]  # CPU


def test_tune_needs_a_gpu(capsys):
    from anybit.cli import main

    if torch.cuda.is_available():
        pytest.skip("has a GPU")
    assert main(["tune", "--schemes", "w4a16", "--m", "1"]) == 2
    assert "CUDA GPU" in capsys.readouterr().err


def test_torch_backend_runs_fp8_channel_schemes_through_scaled_mm():
    """w8a8-fp8 on the torch backend: `_scaled_mm` on the FP8 operands equals the dequantized product."""
    from anybit.quant.activations import dequantize_activation, quantize_activation

    qw = anybit.quantize(torch.randn(48, 256), "w8a8-fp8")
    p = prepare(qw, backend="torch")
    assert p.data is not None and p.data[0].dtype == torch.float8_e4m3fn
    x = torch.randn(2, 5, 256).half()
    xd = dequantize_activation(*quantize_activation(x, qw.scheme.act), qw.scheme.act).double()
    y = gemm(x, p)
    assert y.shape == (2, 5, 48) and rel_err(y, xd @ qw.dequantize().double().T) < GEMM_REL_ERR[torch.float16]
    assert prepare(anybit.quantize(torch.randn(48, 256), "w4a8"), backend="torch").data is None


@pytest.mark.parametrize("scheme", ["w4a16", "w4a16-zp", "nvfp4", "w8a16"])
def test_humming_tensors_of_an_expert_stack_are_the_stacked_experts(scheme):
    qw = anybit.quantize(torch.randn(3, 64, 256) * 0.05, scheme)
    dtype = torch.float16 if "zp" in scheme else torch.bfloat16
    stack = humming_tensors(qw, dtype)
    for e in range(3):
        one = humming_tensors(qw.expert(e), dtype)
        for name, t in one.items():
            got = stack[name][e].reshape(t.shape)
            assert torch.equal(got.view(torch.uint8) if got.element_size() == 1 else got,
                               t.view(torch.uint8) if t.element_size() == 1 else t), name  # fmt: skip


def test_pdl_on_sm90_unless_turned_off(monkeypatch):
    """`pdl_launch`: on an sm_90+ GPU unless ANYBIT_PDL=0, never on the CPU or under the interpreter."""
    from anybit.backends import triton as triton_backend

    gpu = torch.device("cuda", 0)
    monkeypatch.setattr(triton_backend, "_major", lambda device: 9)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setenv("ANYBIT_PDL", "0")
    assert not triton_backend.pdl_launch(gpu)
    monkeypatch.delenv("ANYBIT_PDL")
    assert triton_backend.pdl_launch(gpu) and not triton_backend.pdl_launch(torch.device("cpu"))
    monkeypatch.setattr(triton_backend, "_major", lambda device: 8)
    assert not triton_backend.pdl_launch(gpu)
    monkeypatch.setattr(triton_backend, "_major", lambda device: 9)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not triton_backend.pdl_launch(gpu)


def test_call_path_reads_no_whole_settings(monkeypatch, interpret):
    """After the first call (tiles and routes cached), a dense frag GEMM and a QuantMoE layer read only
    the single variables they need: a whole `settings.load()` costs ~11 µs of host time per read."""
    from anybit import settings
    from anybit.moe import QuantMoE, softmax_topk

    g = torch.Generator().manual_seed(3)
    p = prepare(anybit.quantize(torch.randn(128, 256, generator=g) * 0.05, "w4a16"), backend="triton")
    gate_up, down = torch.randn(4, 256, 128, generator=g) * 0.05, torch.randn(4, 128, 128, generator=g) * 0.05
    moe = QuantMoE.from_float(gate_up, down, "w4a16")
    x, xm = torch.randn(3, 256, generator=g).half(), torch.randn(2, 128, generator=g).half()
    w, ids = softmax_topk(torch.randn(2, 4, generator=g), 2)
    first, first_moe = gemm(x, p), moe(xm, w, ids)

    def whole_read():
        raise AssertionError("settings.load() on the call path")

    monkeypatch.setattr(settings, "load", whole_read)
    assert torch.equal(gemm(x, p), first) and torch.equal(moe(xm, w, ids), first_moe)


@pytest.mark.parametrize("scheme", ["w4a16", "w3a16:int3:g64:bf16"])  # the fragment-layout and the bit-plane kernel
def test_a_tile_over_this_gpus_shared_memory_retries_shallower(interpret, monkeypatch, scheme):
    """sm_86/89 GPUs have 99 KB of shared memory per block, where Hopper tiles ask up to 117 KB: Triton
    refuses such a launch before it runs, and the backend retries one pipeline stage shallower and keeps
    that tile for the weight and M (simulated here: launches of > 3 stages are refused)."""
    from triton.runtime.errors import OutOfResources

    from anybit.backends import triton as tb
    from anybit.kernels.gemm import GemmConfig

    refused = []

    def limited(kernel):
        def launch(*args, **kw):
            stages = kw["num_stages"] if "num_stages" in kw else kw["config"].num_stages
            if stages > 3:
                refused.append(stages)
                raise OutOfResources(110592, 101376, "shared memory")
            return kernel(*args, **kw)

        return launch

    monkeypatch.setattr(tb, "gemm_frag", limited(tb.gemm_frag))
    monkeypatch.setattr(tb, "gemm_dense", limited(tb.gemm_dense))
    qw = anybit.quantize(torch.randn(72, 256), scheme)
    p = prepare(qw, backend="triton")
    frag = p.data.frag
    p.data.configs[5] = GemmConfig(16, 64 if frag else 32, 128 if frag else 32, num_warps=4, num_stages=5)
    x = torch.randn(5, 256).half()
    for _ in range(2):
        y = get_backend("triton").gemm(x, p)
        assert rel_err(y, x.double() @ qw.dequantize().double().T) < GEMM_REL_ERR[torch.float16]
    assert refused == [5, 4] and p.data.configs[5].num_stages == 3  # the second call launched at once


def test_only_shared_memory_over_the_limit_is_retried():
    from triton.runtime.errors import OutOfResources

    from anybit.kernels.gemm import GemmConfig, fewer_stages

    tile = GemmConfig(64, 128, 64, num_stages=4)
    assert fewer_stages(OutOfResources(1, 0, "shared memory"), tile).num_stages == 3
    assert fewer_stages(OutOfResources(1, 0, "shared memory"), dict(num_stages=3, block_m=64)) == dict(
        num_stages=2, block_m=64
    )
    with pytest.raises(OutOfResources):
        fewer_stages(OutOfResources(1, 0, "threads"), tile)
    with pytest.raises(OutOfResources):
        fewer_stages(OutOfResources(1, 0, "shared memory"), dict(num_stages=2))


@pytest.mark.parametrize("backend", ["torch", "auto"])
@pytest.mark.parametrize("bias, what", [(torch.zeros(255), r"\(255,\)"), (torch.zeros(1, 256), r"\(1, 256\)"),
                                        (torch.zeros(256, dtype=torch.float32), "float32")])  # fmt: skip
def test_bias_of_the_wrong_shape_or_dtype_is_named(backend, bias, what):
    p = prepare(anybit.quantize(torch.randn(256, 128) * 0.05, "w4a16"), backend)
    with pytest.raises(AnybitError, match=r"bias must be \[256\].*" + what):
        gemm(torch.randn(3, 128).half(), p, bias)
