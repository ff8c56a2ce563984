"""The allowlist of a built CUDA extension's undefined symbols (eval_server/checks/cuda_symbols.py);
tests/integration/test_cuda_build_cache.py runs it on real builds."""

from __future__ import annotations

import pytest

from eval_server.checks.cuda_symbols import refused_symbols, why_refused

pytestmark = pytest.mark.unit

ALLOWED = [
    "cudaLaunchKernel", "cudaGetLastError", "cudaGetErrorString", "cudaMemsetAsync", "cudaFuncSetAttribute",
    "__cudaRegisterFatBinary", "__cudaRegisterFunction", "__cudaPushCallConfiguration", "__cudaPopCallConfiguration",
    "c10::cuda::getCurrentCUDAStream(signed char)", "c10::detail::torchCheckFail(char const*, char const*, unsigned int, char const*)",
    "at::_ops::empty_memory_format::call(c10::ArrayRef<c10::SymInt>, std::optional<c10::ScalarType>)",
    "at::_ops::zeros_like::call(at::Tensor const&)", "at::_ops::copy_::call(at::Tensor&, at::Tensor const&, bool)",
    "pybind11::detail::get_internals()", "std::__throw_length_error(char const*)", "operator delete(void*, unsigned long)",
    "typeinfo for c10::Error", "THPVariable_Wrap(at::TensorBase const&)", "PyObject_GetAttrString", "PyErr_SetString",
    "PyFrame_GetBack", "PyFrame_GetLineNumber", "Py_IncRef", "_Py_Dealloc", "memcpy", "expf", "__cxa_begin_catch",
    "__dynamic_cast", "pthread_mutex_lock", "atexit",
    # a template instantiation's demangled name starts with its return type
    "float* at::TensorBase::data_ptr<float>() const",
    "std::basic_ostream<char, std::char_traits<char> >& std::operator<< <std::char_traits<char> >"
    "(std::basic_ostream<char, std::char_traits<char> >&, char const*)",
    "void pybind11::cpp_function::initialize<at::Tensor (*&)(at::Tensor), at::Tensor, at::Tensor, pybind11::name>"
    "(at::Tensor (*&)(at::Tensor), at::Tensor (*)(at::Tensor), pybind11::name const&)",
]  # fmt: skip
REFUSED = [
    "PyEval_SetProfile", "PyEval_SetTraceAllThreads", "PyEval_GetFrame", "PyThreadState_GetFrame", "PyFrame_GetLocals",
    "PyInterpreterState_ThreadHead", "PyUnstable_GC_VisitObjects", "PyGC_Collect", "PySys_AddAuditHook",
    "PyRun_SimpleString", "Py_CompileString", "PyMarshal_ReadObjectFromString", "PyCode_NewEmpty",
    "cudaStreamCreateWithPriority", "cudaGraphLaunch", "cudaStreamBeginCapture", "cudaGetDriverEntryPoint",
    "cudaStreamSetAttribute", "cudaDeviceSetLimit", "cudaLaunchHostFunc", "cuGetProcAddress_v2", "cuLaunchKernel",
    "cublasSgemm_v2", "cudnnConvolutionForward", "c10::cuda::getStreamFromPool(bool, signed char)",
    "at::cuda::getCurrentCUDABlasHandle()", "at::_ops::mm::call(at::Tensor const&, at::Tensor const&)",
    "at::_ops::add_Tensor::call(at::Tensor const&, at::Tensor const&, c10::Scalar const&)",
    "at::native::relu(at::Tensor const&)", "std::thread::_M_start_thread(std::unique_ptr<std::thread::_State>, void (*)())",
    "dlopen", "dlsym", "fork", "execve", "system", "popen", "pthread_create", "syscall", "mmap", "mprotect", "fopen",
    "open64", "ptrace", "kill",
    # the same behind a template's return type
    "cublasStatus_t* foo<int>(int)", "c10::cuda::CUDAStream c10::cuda::getStreamFromPool<int>(int)",
]  # fmt: skip


@pytest.mark.parametrize("symbol", ALLOWED)
def test_what_a_kernel_extension_needs_is_allowed(symbol: str) -> None:
    assert why_refused(symbol) is None


@pytest.mark.parametrize("symbol", REFUSED)
def test_interpreter_internals_libraries_streams_and_processes_are_refused(symbol: str) -> None:
    assert why_refused(symbol) is not None


def test_refused_symbols_names_each_once_with_why() -> None:
    got = refused_symbols(
        ["memcpy", "dlopen", "dlopen", "at::_ops::mm::call(at::Tensor const&, at::Tensor const&)"]
    )
    assert got == [
        "at::_ops::mm::call(at::Tensor const&, at::Tensor const&) (an ATen operator that computes)",
        "dlopen (not on the allowlist)",
    ]
