"""Lets kvfs.torch's pin=True path (and kvfs.hf's pinned layer-by-layer loads) run on CPU tensors, for the tests.

kvfs.torch moves CUDA tensors; on a machine without a GPU the tests swap
torch.cuda's device/stream/event calls and the driver's cuMemHostRegister for
no-ops, so what runs is kvfs.torch's own logic (staging layout, chunking,
double buffering, the scatter into the cache tensors) and the daemon's.
"""

import contextlib


class _Nop:
    def __init__(self, *a, **k):
        pass

    def __getattr__(self, name):
        return lambda *a, **k: None


def enter(kt, torch):
    """Switches kvfs.torch (module kt) to CPU tensors; returns what leave() restores."""
    saved = (kt._CPU_FOR_TESTS, kt.CudaDriver, torch.cuda.device, torch.cuda.stream,
             torch.cuda.current_stream, torch.cuda.Event, torch.cuda.Stream)
    kt._CPU_FOR_TESTS = True
    kt.CudaDriver = _Nop
    torch.cuda.device = lambda *a: contextlib.nullcontext()
    torch.cuda.stream = lambda *a: contextlib.nullcontext()
    torch.cuda.current_stream = lambda *a: _Nop()
    torch.cuda.Event = _Nop
    torch.cuda.Stream = _Nop
    return saved


def leave(kt, torch, saved):
    (kt._CPU_FOR_TESTS, kt.CudaDriver, torch.cuda.device, torch.cuda.stream,
     torch.cuda.current_stream, torch.cuda.Event, torch.cuda.Stream) = saved


@contextlib.contextmanager
def active(kt, torch):
    """enter() for the duration of a with block."""
    saved = enter(kt, torch)
    try:
        yield
    finally:
        leave(kt, torch, saved)
