"""What kind of work a profiled operator does (:mod:`benchmarks.profile`'s categories): matmul, attention,
elementwise, norm, copy, convolution, compiled (``torch.compile``'s fused kernels) or dispatch (what moves no data),
with the FLOPs or bytes that give each category its rate."""

from __future__ import annotations

import math
from typing import Any

from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

__all__ = ["CATEGORIES", "attention_flops", "category", "operand_bytes"]

MATMULS = frozenset(
    {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::addbmm", "aten::_addmm_activation"}
)
CONVOLUTIONS = frozenset(
    {
        "aten::conv2d",
        "aten::convolution",
        "aten::_convolution",
        "aten::mkldnn_convolution",
        "aten::convolution_backward",
    }
)
FLASH = {
    "aten::_scaled_dot_product_flash_attention_for_cpu": "forward",
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward": "backward",
    "aten::_scaled_dot_product_flash_attention": "forward",
    "aten::_scaled_dot_product_flash_attention_backward": "backward",
}
ATTENTION_ROOTS = frozenset({"aten::_scaled_dot_product_attention_math", *FLASH})
SOFTMAX = frozenset({"aten::_softmax", "aten::_softmax_backward_data", "aten::_safe_softmax"})
NORMS = frozenset(
    {
        "aten::native_layer_norm",
        "aten::native_layer_norm_backward",
        "aten::native_group_norm",
        "aten::native_group_norm_backward",
        "aten::_fused_rms_norm",
        "aten::_fused_rms_norm_backward",
    }
)
COPIES = frozenset(
    {
        "aten::copy_",
        "aten::cat",
        "aten::stack",
        "aten::clone",
        "aten::contiguous",
        "aten::index",
        "aten::index_select",
        "aten::repeat_interleave",
        "aten::repeat",
        "aten::_to_copy",
        "aten::constant_pad_nd",
        "aten::narrow_copy",
        "aten::index_put_",
        "aten::_index_put_impl_",
    }
)
VIEWS = frozenset(
    {
        "aten::view",
        "aten::reshape",
        "aten::_reshape_alias",
        "aten::_unsafe_view",
        "aten::transpose",
        "aten::t",
        "aten::permute",
        "aten::expand",
        "aten::as_strided",
        "aten::slice",
        "aten::select",
        "aten::unsqueeze",
        "aten::squeeze",
        "aten::chunk",
        "aten::split",
        "aten::split_with_sizes",
        "aten::unbind",
        "aten::alias",
        "aten::detach",
        "aten::detach_",
        "aten::lift_fresh",
        "aten::empty",
        "aten::empty_like",
        "aten::empty_strided",
        "aten::resolve_conj",
        "aten::resolve_neg",
        "aten::to",
        "aten::flatten",
        "aten::unflatten",
        "aten::view_as",
        "aten::expand_as",
        "aten::result_type",
        "aten::item",
        "aten::_local_scalar_dense",
        "aten::is_nonzero",
        "aten::numpy_T",
        "aten::matmul",
        "aten::linear",
        "aten::scaled_dot_product_attention",
        "aten::_scaled_dot_product_attention_math",
        "aten::dropout",
    }
)
CATEGORIES = ("matmul", "attention", "elementwise", "norm", "copy", "convolution", "compiled", "dispatch")
"""``compiled``: the fused kernels of ``torch.compile`` (inductor's C++ kernels, profiled by name)."""

DTYPE_BYTES = {"float": 4, "c10::BFloat16": 2, "c10::Half": 2, "double": 8, "long int": 8, "int": 4, "bool": 1}


def _inside_attention(event: Any) -> bool:
    node = event.cpu_parent
    while node is not None:
        if node.name in ATTENTION_ROOTS:
            return True
        node = node.cpu_parent
    return False


def category(event: Any) -> str:
    """An operator's :data:`CATEGORIES` entry by its name (and, for a matmul or softmax, by whether it runs inside
    an attention call)."""
    name = event.name
    if name in FLASH or name in SOFTMAX:
        return "attention"
    if name in MATMULS:
        return "attention" if _inside_attention(event) else "matmul"
    if name in CONVOLUTIONS:
        return "convolution"
    if name in NORMS:
        return "norm"
    if name in COPIES:
        return "copy"
    if name in VIEWS or not name.startswith("aten::"):
        return "compiled" if "cpp_fused" in name or name.startswith("graph_") else "dispatch"
    return "elementwise"


def operand_bytes(event: Any) -> int:
    """Bytes of the tensors an operator reads, plus its largest operand's once more for what it writes (an
    estimate: an elementwise result is the size of its largest input)."""
    sizes = []
    for shape, dtype in zip(event.input_shapes or [], event.input_dtypes or [], strict=False):
        if isinstance(shape, list) and shape and all(isinstance(d, int) for d in shape):
            sizes.append(math.prod(shape) * DTYPE_BYTES.get(dtype, 4))
    return sum(sizes) + max(sizes, default=0)


def attention_flops(event: Any) -> int:
    """The flash kernels' FLOPs from their operand shapes (``4 b h s_q s_k d`` forward, 2.5x that backward)."""
    shapes = event.input_shapes
    if FLASH.get(event.name) == "forward":
        return int(sdpa_flop_count(shapes[0], shapes[1], shapes[2]))
    if FLASH.get(event.name) == "backward":
        return int(sdpa_backward_flop_count(shapes[0], shapes[1], shapes[2], shapes[3]))
    return int(event.flops or 0)
