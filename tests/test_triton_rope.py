"""Part VI on the GPU: the Triton kernel (``rope_tutor.triton_rope``, ``rope_tutor.rope_kernel``).

Three kinds of test:

* the kernel against the reference ``apply_rope``, in Triton's interpreter on the CPU: every
  layout, dtype, ``rotary_dim``, scaling method, head count, positions shape, output mode, strides
  and the backward. They live in ``triton_interpreter_cases.py`` and run here in a subprocess,
  because ``TRITON_INTERPRET=1`` must be set before triton is imported and must reach no other test;
* what needs no triton at all: the package imports without it, the checks, the reference path;
* on a CUDA device only (skipped elsewhere, with the reason): the compiled kernel against the
  reference, no host-device synchronisation (``torch.cuda.set_sync_debug_mode("error")``), a
  CUDA-graph capture, and the device-side check of the positions.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest
import torch
from rope_cases import SCALINGS

import rope_tutor
import rope_tutor as rt
from rope_tutor import triton_rope
from rope_tutor.rope import apply_rope
from rope_tutor.scaling import rope_parameters
from rope_tutor.triton_rope import apply_rope_qk, apply_rope_triton

HERE = Path(__file__).resolve().parent
#: The folder holding the rope_tutor these tests imported (the worktree or an installed wheel).
PACKAGE_ROOT = Path(rope_tutor.__file__).resolve().parent.parent
HAS_TRITON = importlib.util.find_spec("triton") is not None
HAS_CUDA = torch.cuda.is_available()
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
_skip_without_cuda = pytest.mark.skipif(
    not (HAS_CUDA and HAS_TRITON), reason="needs a CUDA device (and triton) for the compiled kernel"
)


def needs_cuda(test):
    """Skipped without a CUDA device; marked ``cuda``, which `make gpu-check` selects."""
    return pytest.mark.cuda(_skip_without_cuda(test))


def run_python(code: str, **environment: str) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter that imports the same rope_tutor as this test."""
    path = os.pathsep.join([str(PACKAGE_ROOT), os.environ.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": path, **environment},
    )


# -- the kernel in the interpreter ----------------------------------------------------------------


@pytest.mark.slow  # about 20 s on two cores: some 130 kernel runs in the interpreter
@needs_triton
def test_kernel_agrees_with_reference_in_the_interpreter(tmp_path: Path) -> None:
    report = tmp_path / "report.xml"
    path = os.pathsep.join([str(PACKAGE_ROOT), os.environ.get("PYTHONPATH", "")])
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            str(HERE / "triton_interpreter_cases.py"),
            "-q",
            "-p",
            "no:cacheprovider",
            "-o",
            "addopts=",
            f"--junitxml={report}",
        ],  # fmt: skip
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        env={**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": path},
    )
    log = (result.stdout + result.stderr)[-8000:]
    assert result.returncode == 0, log
    suite = ElementTree.parse(report).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    counts = {key: int(suite.get(key)) for key in ("tests", "failures", "errors", "skipped")}
    assert counts["failures"] == counts["errors"] == counts["skipped"] == 0, (counts, log)
    assert counts["tests"] >= 120, counts  # every case ran (none skipped, none lost)


#: Compiles the kernel for an H100 (sm_90) without one: strides of 1 and 0 and divisibility by 16
#: specialised as a launch on contiguous (batch, heads, seq, dim) tensors specialises them.
COMPILE_FOR_H100 = """
import inspect, re, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from rope_tutor.rope_kernel import rope_qk_kernel

names = list(inspect.signature(rope_qk_kernel.fn).parameters)
CASES = (("bf16", False, True), ("bf16", True, False), ("fp32", False, True))
for dtype, interleaved, check in CASES:
    signature, constants, attributes = {}, {}, {}
    for i, name in enumerate(names):
        if name in ("Q", "K", "OUT_Q", "OUT_K", "POSITIONS", "INV_FREQ", "COS_TABLE", "SIN_TABLE"):
            kind = "i64" if name == "POSITIONS" else "fp32" if name[-4:] in "FREQTABLE" else dtype
            signature[name] = "*" + kind
            attributes[(i,)] = [["tt.divisibility", 16]]
        elif name == "attention_factor":
            signature[name] = "fp32"
        elif name.startswith("stride") and (name.endswith("d") or name == "stride_ps"):
            signature[name], constants[name] = "constexpr", 1
        elif name == "stride_pb":
            signature[name], constants[name] = "constexpr", 0
        elif name.startswith("stride"):
            signature[name] = "i32"
            attributes[(i,)] = [["tt.divisibility", 16]]
        else:
            signature[name] = "constexpr" if name.isupper() else "i32"
    constants.update(HALF=64, REST=0, BLOCK_H=2, BLOCK_S=16, BLOCK_HALF=64, BLOCK_REST=1,
                     INTERLEAVED=interleaved, CONJUGATE=False, HAS_POSITIONS=True, COPY_REST=False,
                     TABLE=False, CHECK_POSITIONS=check)
    source = ASTSource(
        fn=rope_qk_kernel, signature=signature, attrs=attributes,
        constexprs={(names.index(k),): v for k, v in constants.items()},
    )
    options = {"num_warps": 4, "debug": check, "sanitize_overflow": False}  # as launch() sets them
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)
    ptx = compiled.asm["ptx"]
    vector_loads = len(re.findall(r"ld\\.global[^\\n]*\\.v4", ptx))
    vector_stores = len(re.findall(r"st\\.global[^\\n]*\\.v4", ptx))
    approximate = "sin.approx" in ptx or "cos.approx" in ptx
    asserts = "__assertfail" in ptx
    print(dtype, interleaved, vector_loads, vector_stores, approximate, check == asserts)
"""


@pytest.mark.slow  # about 10 s: three compilations to PTX
@needs_triton
def test_kernel_compiles_for_an_h100_with_vector_loads_exact_sin_cos_and_its_check() -> None:
    # No GPU needed: Triton compiles to PTX for sm_90 here. Each thread must move 16-byte vectors
    # (the half layout's two halves and the interleaved layout's whole rows), and sin and cos must
    # be libdevice's (not sin.approx, whose error grows with the angle: positions reach 8191).
    result = run_python(COMPILE_FOR_H100)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    lines = [line.split() for line in result.stdout.strip().splitlines()]
    assert len(lines) == 3, result.stdout
    for dtype, interleaved, vector_loads, vector_stores, approximate, assert_as_asked in lines:
        assert int(vector_loads) >= 8 and int(vector_stores) >= 8, (dtype, interleaved)
        assert approximate == "False", (dtype, interleaved)
        assert assert_as_asked == "True", (dtype, interleaved)  # the position check, compiled in


# -- without triton, and the checks ---------------------------------------------------------------


def test_import_does_not_need_triton() -> None:
    # triton blocked: the package imports, the CPU paths work, and nothing asks for the kernel.
    result = run_python(
        """
        import sys

        class Block:
            def find_spec(self, name, path=None, target=None):
                if name == "triton" or name.startswith("triton."):
                    raise ModuleNotFoundError(f"No module named {name!r} (blocked)")

        sys.meta_path.insert(0, Block())
        import torch
        import rope_tutor as rt
        from rope_tutor.triton_rope import apply_rope_qk, kernel_applies, triton_available

        assert not triton_available() and not kernel_applies(torch.zeros(1, 2))
        x, p = torch.randn(1, 2, 5, 8), torch.arange(5)
        assert torch.equal(rt.apply_rope_fast(x, p), rt.apply_rope_fast(x, p))
        q, k = apply_rope_qk(x, x[:, :1], p)
        assert torch.equal(q, rt.apply_rope(x, p)) and torch.equal(k, rt.apply_rope(x[:, :1], p))
        print("ok")
        """
    )
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-3000:]


def test_import_rope_tutor_does_not_import_triton() -> None:
    result = run_python(
        """
        import sys
        import rope_tutor
        print("triton" in sys.modules, "rope_tutor.rope_kernel" in sys.modules)
        """
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["False", "False"]


def test_the_cpu_without_the_interpreter_takes_the_reference(monkeypatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    q, k = torch.randn(2, 4, 5, 8), torch.randn(2, 1, 5, 8)
    positions = torch.tensor([[0, 1, 2, 3, 4], [7, 8, 9, 10, 11]])
    assert not triton_rope.kernel_applies(q)
    got_q, got_k = apply_rope_qk(q, k, positions, layout="interleaved")
    for got, x in ((got_q, q), (got_k, k)):
        for b in range(2):  # row by row
            expected = apply_rope(x[b], positions[b], layout="interleaved")
            torch.testing.assert_close(got[b], expected, rtol=0, atol=0)


def q_and_k():
    return torch.randn(1, 4, 3, 8), torch.randn(1, 2, 3, 8)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda q, k: apply_rope_qk(q[0], k), r"q must have shape \(batch, heads, seq, dim\)"),
        (lambda q, k: apply_rope_qk(q, k.int()), "k must be a floating-point tensor"),
        (lambda q, k: apply_rope_qk(q, k[..., :2, :]), "q and k must agree in batch, seq and dim"),
        (lambda q, k: apply_rope_qk(q, k.double()), "q and k differ"),
        (lambda q, k: apply_rope_qk(q[..., :7], k[..., :7]), "q must have an even last dim"),
        (lambda q, k: apply_rope_qk(q, k, layout="halves"), "layout"),
        (lambda q, k: apply_rope_qk(q, k, rotary_dim=10), "rotary_dim=10 exceeds the head dim 8"),
        (lambda q, k: apply_rope_qk(q, k, out_q=torch.empty(2)), "out_q has shape"),
        (lambda q, k: apply_rope_qk(q, k, out_k=q), "out_k has shape"),
        (lambda q, k: apply_rope_qk(q, k, out_k=q[:, 2:]), "out_k overlaps q"),
        (lambda q, k: apply_rope_qk(q, k, inplace=True, out_q=q.clone()), "out_q and out_k must"),
        (lambda q, k: apply_rope_qk(q, k, inplace=1), "inplace must be True or False"),
        (
            lambda q, k: apply_rope_qk(q.requires_grad_(), k, inplace=True),
            "inplace=True with q a leaf tensor that requires grad",
        ),
        (lambda q, k: apply_rope_qk(q, k, torch.arange(4)), "positions has length 4"),
        (lambda q, k: apply_rope_qk(q, k, torch.zeros(2, 3)), r"must be \(batch, seq\) = \(1, 3\)"),
        (lambda q, k: apply_rope_qk(q, k, torch.zeros(1, 1, 3)), "positions must be 1-D"),
        (lambda q, k: apply_rope_qk(q, k, torch.ones(3, dtype=torch.bool)), "integers or floats"),
        (lambda q, k: apply_rope_qk(q, k, [0, -1, 2]), "positions must be finite and >= 0"),
        (lambda q, k: apply_rope_triton(q, inplace=True, out=q.clone()), "out must then be None"),
        (lambda q, k: apply_rope_triton("q"), "x must be a floating-point tensor"),
    ],
)
def test_bad_arguments_raise_naming_them(call, match) -> None:
    q, k = q_and_k()
    with pytest.raises(ValueError, match=match):
        call(q, k)


def test_position_errors_read_as_apply_rope_s() -> None:
    q, k = q_and_k()
    for bad in ([0, -1, 2], [0.0, float("nan"), 1.0], [0, 1]):
        with pytest.raises(ValueError) as reference:
            apply_rope(q, torch.tensor(bad))
        with pytest.raises(ValueError) as ours:
            apply_rope_qk(q, k, torch.tensor(bad))
        assert str(ours.value) == str(reference.value)


#: One setting per Part IV method, for a rotated size of 16 (the fast paths' shared cases).
SETTINGS = {name: setting for name, setting in SCALINGS.items() if setting}


def test_length_dependent_methods_are_the_ones_that_read_the_length() -> None:
    # The kernel's wrapper reads the length on the host (a synchronisation) for these methods
    # only, so the set must hold exactly the methods whose frequencies change with the length.
    assert set(SETTINGS) == set(rt.SCALINGS)
    changes = set()
    for name, setting in SETTINGS.items():
        short = rope_parameters(16, 500.0, setting, seq_len=8)
        long = rope_parameters(16, 500.0, setting, seq_len=10_000)
        if not torch.equal(short[0], long[0]) or short[1] != long[1]:
            changes.add(name)
    assert changes == triton_rope.LENGTH_DEPENDENT


def test_device_parameters_are_kept_per_setting() -> None:
    cpu = torch.device("cpu")
    first = triton_rope.device_parameters(16, 500.0, SETTINGS["yarn"], cpu)
    assert triton_rope.device_parameters(16, 500.0, dict(SETTINGS["yarn"]), cpu)[0] is first[0]
    expected = rope_parameters(16, 500.0, SETTINGS["yarn"])
    assert torch.equal(first[0], expected[0]) and first[1] == expected[1]
    other = triton_rope.device_parameters(16, 500.0, SETTINGS["llama3"], cpu)
    assert not torch.equal(other[0], first[0])
    # a length-dependent method is kept per length
    short = triton_rope.device_parameters(16, 500.0, SETTINGS["longrope"], cpu, seq_len=8)
    long = triton_rope.device_parameters(16, 500.0, SETTINGS["longrope"], cpu, seq_len=100)
    assert torch.equal(long[0], rope_parameters(16, 500.0, SETTINGS["longrope"], seq_len=100)[0])
    assert not torch.equal(short[0], long[0])


# -- on a CUDA device ---------------------------------------------------------------------------


def cuda_case(dtype: torch.dtype, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 8, 37, 64, generator=generator).to("cuda", dtype)
    k = torch.randn(2, 2, 37, 64, generator=generator).to("cuda", dtype)
    positions = (torch.arange(37, device="cuda") * 223) % 8192  # up to 8191: large angles
    return q, k, positions


def assert_agree(got: torch.Tensor, reference: torch.Tensor, x: torch.Tensor) -> None:
    """Up to 8 units in the last place of float32, then one rounding to x's dtype."""
    scale = 2 * x.double().abs().amax(dim=-1, keepdim=True)
    bound = 8 * torch.finfo(torch.float32).eps * scale
    if x.dtype in (torch.bfloat16, torch.float16):
        bound = bound + torch.finfo(x.dtype).eps * reference.double().abs()
    gap = (got.double() - reference.double()).abs()
    assert (gap <= bound).all(), float((gap - bound).max())


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_cuda_kernel_agrees_with_reference(layout, dtype) -> None:
    q, k, positions = cuda_case(dtype)
    kwargs = {"layout": layout, "rotary_dim": 48, "scaling": SETTINGS["yarn"]}
    got_q, got_k = apply_rope_qk(q, k, positions, **kwargs)
    assert_agree(got_q, apply_rope(q, positions, **kwargs), q)
    assert_agree(got_k, apply_rope(k, positions, **kwargs), k)
    assert_agree(rt.apply_rope_fast(q, positions, **kwargs), apply_rope(q, positions, **kwargs), q)


@needs_cuda
def test_cuda_apply_rope_fast_and_float64(monkeypatch) -> None:
    from rope_tutor import rope_kernel

    launches = []
    original = rope_kernel.launch

    def counting(*args, **kwargs):
        launches.append(kwargs)
        return original(*args, **kwargs)

    monkeypatch.setattr(rope_kernel, "launch", counting)
    q, k, positions = cuda_case(torch.bfloat16)
    rt.apply_rope_fast(q, positions)
    assert len(launches) == 1  # apply_rope_fast on CUDA is the kernel
    q64, k64 = q.double(), k.double()
    got = apply_rope_qk(q64, k64, positions)
    assert len(launches) == 1  # float64 on CUDA takes the reference path
    torch.testing.assert_close(got[0], apply_rope(q64, positions), rtol=0, atol=0)


@needs_cuda
def test_cuda_no_host_device_synchronisation() -> None:
    q, k, positions = cuda_case(torch.bfloat16)
    rows = torch.stack([positions, positions + 5])
    q_grad = q.float().requires_grad_()
    k_grad = k.float().requires_grad_()
    out_q, out_k = torch.empty_like(q), torch.empty_like(k)
    settings = {"scaling": SETTINGS["llama3"], "rotary_dim": 64}

    def calls():
        apply_rope_qk(q, k, positions, **settings)
        apply_rope_qk(q, k, rows, **settings, out_q=out_q, out_k=out_k)
        apply_rope_qk(q.clone(), k.clone(), None, **settings, inplace=True)
        rt.apply_rope_fast(q, positions, **settings)
        a, b = apply_rope_qk(q_grad, k_grad, positions.float(), **settings)
        (a.sum() + b.sum()).backward()

    calls()  # the first call per setting copies its frequencies to the device
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        calls()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()


@needs_cuda
def test_cuda_graph_capture() -> None:
    q, k, positions = cuda_case(torch.float16, seed=1)
    out_q, out_k = torch.empty_like(q), torch.empty_like(k)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up: compile the kernel, copy the frequencies
        for _ in range(2):
            apply_rope_qk(q, k, positions, out_q=out_q, out_k=out_k)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        apply_rope_qk(q, k, positions, out_q=out_q, out_k=out_k)
    fresh_q, fresh_k, _ = cuda_case(torch.float16, seed=2)
    q.copy_(fresh_q)
    k.copy_(fresh_k)
    graph.replay()
    torch.cuda.synchronize()
    assert_agree(out_q, apply_rope(fresh_q, positions), fresh_q)
    assert_agree(out_k, apply_rope(fresh_k, positions), fresh_k)


@needs_cuda
def test_cuda_bad_positions_fail_on_the_device() -> None:
    # A device-side assert leaves the CUDA context unusable: checked in a process of its own.
    result = run_python(
        """
        import torch
        from rope_tutor.triton_rope import apply_rope_qk

        q, k = torch.randn(1, 2, 3, 8, device="cuda"), torch.randn(1, 1, 3, 8, device="cuda")
        apply_rope_qk(q, k, torch.tensor([0, -1, 2], device="cuda"))
        try:
            torch.cuda.synchronize()
        except RuntimeError as error:
            print("raised:", str(error).splitlines()[0])
        """
    )
    assert "raised:" in result.stdout, (result.stdout + result.stderr)[-3000:]


def test_gpu_tests_exist_and_are_marked_for_cuda() -> None:
    # The GPU half of these tests exists, and each of its tests is skipped without CUDA.
    module = sys.modules[__name__]
    cuda_tests = [getattr(module, n) for n in dir(module) if n.startswith("test_cuda_")]
    assert len(cuda_tests) >= 5
    for test in cuda_tests:
        marks = [m for m in getattr(test, "pytestmark", []) if m.name == "skipif"]
        assert marks and "CUDA" in marks[0].kwargs["reason"], test.__name__
        assert marks[0].args[0] == (not (HAS_CUDA and HAS_TRITON))
