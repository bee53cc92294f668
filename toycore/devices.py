"""Where the book computes: ``TOYCORE_DEVICE`` = ``auto`` (default), ``cpu``, ``cuda`` or
``cuda:k``; and how precisely chapter 5's models multiply matrices: ``TOYCORE_MATMUL`` =
``float32`` (default) or ``tf32``, TensorFloat-32's 10-bit mantissa for the products' inputs
(on a GPU its tensor cores; on the CPU the same rounding, emulated, to measure what it changes).

``auto`` means the GPU when torch sees one, else the CPU. A notebook's ``device`` parameter wins
over the environment variable. Every model, data stream, seed generator and trainer is built on
``current()``; results come back to the host (``to_host``) before they are cached, plotted or
checked. The device type is part of the cache key (``toycore.cache``): a GPU's numbers differ in
the last bits from the CPU's, so neither is served the other's results.
"""

import os
import platform
import re

import torch

DEVICE_PATTERN = re.compile(r"cpu|cuda(:\d+)?")
MATMUL_PRECISIONS = ("float32", "tf32")
_current = None


def resolve(device=None):
    """The torch.device for ``device``, else ``$TOYCORE_DEVICE``, else ``auto``.

    A clear ValueError for an unknown value, or for a GPU that torch does not see."""
    value = device if device is not None else os.environ.get("TOYCORE_DEVICE") or "auto"
    value = str(value).strip()
    if value == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not DEVICE_PATTERN.fullmatch(value):
        raise ValueError(f"device must be auto, cpu, cuda or cuda:k; got {value!r}")
    chosen = torch.device(value)
    if chosen.type == "cuda":
        if not torch.cuda.is_available():
            build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
            raise ValueError(
                f"device {value!r} asked for, but torch {torch.__version__} ({build}) "
                f"sees no GPU here; use device 'cpu' or 'auto'"
            )
        if chosen.index is not None and chosen.index >= torch.cuda.device_count():
            raise ValueError(
                f"device {value!r} asked for, but torch sees "
                f"{torch.cuda.device_count()} GPU(s): cuda:0 to "
                f"cuda:{torch.cuda.device_count() - 1}"
            )
    return chosen


def use(device=None):
    """Make ``device`` (see ``resolve``) the one every later computation in this process uses,
    with the matrix-product precision ``matmul_precision`` says."""
    global _current
    chosen, precision = resolve(device), matmul_precision()  # bad values stop here
    _current = chosen
    if chosen.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    return _current


def matmul_precision():
    """``$TOYCORE_MATMUL``: ``float32`` (default) or ``tf32``; a clear error for another."""
    value = os.environ.get("TOYCORE_MATMUL") or "float32"
    if value not in MATMUL_PRECISIONS:
        raise ValueError(f"TOYCORE_MATMUL must be float32 or tf32; got {value!r}")
    return value


def matmul_operand(tensor):
    """``tensor`` as a matrix product reads it: rounded to TF32's 10-bit mantissa (nearest,
    ties to even) where ``tf32`` is asked for on the CPU, which has no such products; as it is
    otherwise (a GPU rounds in its tensor cores)."""
    if tensor.device.type != "cpu" or tensor.dtype != torch.float32:
        return tensor
    if matmul_precision() != "tf32":
        return tensor
    bits = tensor.contiguous().view(torch.int32)
    kept = (bits + 0xFFF + ((bits >> 13) & 1)) & ~0x1FFF  # round away the 13 lowest bits
    return kept.view(torch.float32)


def current():
    """The device in use: the last ``use()``, else what ``resolve()`` says now."""
    return _current if _current is not None else use()


def to_host(tensor):
    """A tensor as a numpy array on the host, detached from autograd."""
    return tensor.detach().cpu().numpy()


def describe(device=None):
    """The device in words, for provenance: the GPU's name, or the CPU's with its core count."""
    device = current() if device is None else torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{_cpu_name()}, {os.cpu_count()} cores"


def _cpu_name():
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "CPU"
