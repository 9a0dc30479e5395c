import pytest
import torch

from course_utils import inductor_code


def chain(x):
    return (torch.sin(x) * 2).cos()  # three element-wise operations


def matmul_relu(x, w):
    return torch.relu(x @ w)


def test_generated_code_returns_the_result_and_one_source_per_graph():
    x = torch.randn(16, 16)
    out, sources = inductor_code.generated_code(torch.compile(chain), x)
    torch.testing.assert_close(out, chain(x))
    assert len(sources) == 1 and "def call(" in sources[0]


def test_an_element_wise_chain_is_one_fused_kernel_and_no_library_call():
    _, (source,) = inductor_code.generated_code(torch.compile(chain), torch.randn(16, 16))
    kernels = inductor_code.fused_kernels(source)
    assert len(kernels) == 1
    assert all(op in kernels[0] for op in ("sin", "mul", "cos"))
    assert inductor_code.library_calls(source) == []
    assert kernels[0] in inductor_code.wrapper_call(source)
    assert inductor_code.kernel_calls(source) == kernels


def test_matmul_relu_is_a_library_call_plus_one_kernel():
    _, (source,) = inductor_code.generated_code(torch.compile(matmul_relu), torch.randn(16, 16),
                                                torch.randn(16, 16))
    assert inductor_code.library_calls(source) == ["mm"]
    kernels = inductor_code.fused_kernels(source)
    assert len(kernels) == 1 and "relu" in kernels[0] and "mm" not in kernels[0]
    call = inductor_code.wrapper_call(source)
    assert call.index("extern_kernels.mm(") < call.index(f"{kernels[0]}(")  # matmul first, then relu
    assert call.rstrip().splitlines()[-1].strip().startswith("return ")
    assert inductor_code.kernel_calls(source) == kernels  # the library call is not a generated kernel


def test_a_graph_break_gives_two_sources():
    def broken(x):
        y = torch.sin(x)
        torch._dynamo.graph_break()
        return y.cos()

    x = torch.randn(8)
    out, sources = inductor_code.generated_code(torch.compile(broken), x)
    torch.testing.assert_close(out, broken(x))
    assert len(sources) == 2
    assert [len(inductor_code.fused_kernels(s)) for s in sources] == [1, 1]


def test_kernel_source_and_count_read_the_cpp():
    _, (source,) = inductor_code.generated_code(torch.compile(chain), torch.randn(64, 64))
    (name,) = inductor_code.fused_kernels(source)
    cpp = inductor_code.kernel_source(source, name)
    assert 'extern "C"' in cpp and "kernel(" in cpp and "'''" not in cpp
    assert inductor_code.count(source, r"^cpp_fused\w* = ") == 1
    assert inductor_code.count(source, r"std::sin|sin\(") >= 1
    with pytest.raises(ValueError):
        inductor_code.kernel_source(source, "no_such_kernel")


def test_vectorisation_shows_in_the_count():
    x = torch.randn(64, 64)
    _, (vector,) = inductor_code.generated_code(torch.compile(chain), x)
    _, (scalar,) = inductor_code.generated_code(torch.compile(chain, options={"cpp.simdlen": 1}), x)
    assert inductor_code.count(vector, r"at::vec::Vectorized") > 0
    assert inductor_code.count(scalar, r"at::vec::Vectorized") == 0


def test_the_parsers_on_a_fixed_text():
    text = (
        "cpp_fused_a_0 = async_compile.cpp_pybinding(['float*'], '''\nextern \"C\" void kernel() {}\n''')\n"
        "triton_poi_fused_b_1 = async_compile.triton('triton_poi_fused_b_1', '''\n@triton.jit\n''')\n"
        "def call(args):\n    extern_kernels.addmm(a, b, c, out=d)\n    cpp_fused_a_0(d)\n    return (d, )\n"
        "async_compile.wait(globals())\n"
    )
    assert inductor_code.fused_kernels(text) == ["cpp_fused_a_0", "triton_poi_fused_b_1"]
    assert inductor_code.library_calls(text) == ["addmm"]
    assert inductor_code.wrapper_call(text).endswith("return (d, )")
    assert inductor_code.kernel_calls(text) == ["cpp_fused_a_0"]
    calls = "    cpp_fused_a_0(d)\n    triton_poi_fused_b_1.run(d)\n    cpp_fused_a_0(d)\n"
    twice = text.replace("    cpp_fused_a_0(d)\n", calls)
    assert inductor_code.kernel_calls(twice) == ["cpp_fused_a_0", "triton_poi_fused_b_1", "cpp_fused_a_0"]
    assert inductor_code.kernel_source(text, "triton_poi_fused_b_1") == "\n@triton.jit\n"
    assert inductor_code.count(text, r"^\w+ = async_compile") == 2


def test_scalar_note_speaks_only_where_inductor_writes_no_vector_code(monkeypatch):
    from torch._inductor import cpu_vec_isa

    monkeypatch.setattr(cpu_vec_isa, "pick_vec_isa", lambda: cpu_vec_isa.invalid_vec_isa)
    assert not inductor_code.vectorises_here()
    assert "no SIMD vector code" in inductor_code.scalar_note()
    assert "same setting" in inductor_code.scalar_note() and "same setting" not in inductor_code.scalar_note(compared=False)
    monkeypatch.setattr(cpu_vec_isa, "pick_vec_isa", lambda: cpu_vec_isa.VecAVX2())
    assert inductor_code.vectorises_here() and inductor_code.scalar_note() == ""
