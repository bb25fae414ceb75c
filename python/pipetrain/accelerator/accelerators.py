"""The two accelerators DeepSpeed scripts meet through get_accelerator(): CPU and CUDA, with
DeepSpeed's method names (device, RNG, streams, memory, dtypes, communication backend)."""
import contextlib
import os
import resource

import torch

from ..errors import UsageError

__all__ = ['CPU_Accelerator', 'CUDA_Accelerator']


class _Accelerator:
    """What both share: the op builders DeepSpeed compiles are not part of pipetrain."""

    _name = None
    _communication_backend_name = None

    def communication_backend_name(self):
        return self._communication_backend_name

    def random(self):
        return torch.random

    def create_op_builder(self, op_name):
        raise UsageError(f"DeepSpeed's compiled op {op_name!r} is not part of pipetrain: its engine runs its own "
                         'native kernels and optimizers (choose them in the config)')

    get_op_builder = create_op_builder

    def is_triton_supported(self):
        return False

    def __repr__(self):
        return f'{type(self).__name__}()'


def _rss_bytes():
    # Resident memory of this process: the CPU accelerator's "allocated memory", as DeepSpeed's.
    try:
        with open('/proc/self/statm', encoding='ascii') as f:
            return int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE')
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _meminfo(key):
    with open('/proc/meminfo', encoding='ascii') as f:
        for line in f:
            if line.startswith(key + ':'):
                return int(line.split()[1]) * 1024
    raise UsageError(f'/proc/meminfo has no {key}: the host memory size is unknown on this system')


def _numa_nodes_with_cpus():
    root = '/sys/devices/system/node'
    try:
        nodes = [n for n in os.listdir(root) if n.startswith('node') and n[4:].isdigit()]
    except OSError:
        return 1
    count = 0
    for node in nodes:
        try:
            with open(os.path.join(root, node, 'cpulist'), encoding='ascii') as f:
                count += bool(f.read().strip())
        except OSError:
            pass
    return max(count, 1)


class CPU_Accelerator(_Accelerator):  # pylint: disable=invalid-name  - DeepSpeed's name
    """The host as DeepSpeed's CPU accelerator presents it: one device "cpu", no streams or
    events, memory figures from the process's resident size, Gloo for collectives."""

    _name = 'cpu'
    _communication_backend_name = 'gloo'

    def __init__(self):
        self.max_mem = _rss_bytes()

    def is_synchronized_device(self):
        return True

    # Devices
    def device_name(self, device_index=None):
        del device_index
        return 'cpu'

    def device(self, device_index=None):
        del device_index

    def set_device(self, device_index):
        del device_index

    def current_device(self):
        # DeepSpeed returns LOCAL_RANK as the environment holds it (a string when set); an int here.
        return int(os.environ.get('LOCAL_RANK', 0))

    def current_device_name(self):
        return 'cpu'

    def device_count(self):
        """LOCAL_SIZE when set, else the number of NUMA nodes that have CPUs (DeepSpeed's rule)."""
        local = int(os.environ.get('LOCAL_SIZE', 0))
        return local if local > 0 else _numa_nodes_with_cpus()

    def synchronize(self, device_index=None):
        del device_index

    # Random numbers
    def set_rng_state(self, new_state, device_index=None):
        del device_index
        torch.set_rng_state(new_state)

    def get_rng_state(self, device_index=None):
        del device_index
        return torch.get_rng_state()

    def manual_seed(self, seed):
        return torch.manual_seed(seed)

    def manual_seed_all(self, seed):
        return torch.manual_seed(seed)

    def initial_seed(self):
        return torch.initial_seed()

    def default_generator(self, device_index=None):
        del device_index
        return torch.default_generator

    # Streams and events: none on the host
    Stream = None
    Event = None

    def stream(self, stream):
        del stream
        return contextlib.nullcontext()

    def current_stream(self, device_index=None):
        del device_index

    def default_stream(self, device_index=None):
        del device_index

    # Memory: the process's resident size, its peak since the last reset
    def empty_cache(self):
        pass

    def _rss(self):
        mem = _rss_bytes()
        self.max_mem = max(self.max_mem, mem)
        return mem

    def memory_allocated(self, device_index=None):
        del device_index
        return self._rss()

    def max_memory_allocated(self, device_index=None):
        del device_index
        self._rss()
        return self.max_mem

    def reset_max_memory_allocated(self, device_index=None):
        del device_index
        self.max_mem = _rss_bytes()

    memory_cached = memory_reserved = memory_allocated
    max_memory_cached = max_memory_reserved = max_memory_allocated
    reset_max_memory_cached = reset_peak_memory_stats = reset_max_memory_allocated

    def memory_stats(self, device_index=None):
        del device_index
        mem = self._rss()
        return {'allocated_bytes.all.current': mem, 'allocated_bytes.all.peak': self.max_mem}

    def total_memory(self, device_index=None):
        del device_index
        return _meminfo('MemTotal')

    def available_memory(self, device_index=None):
        del device_index
        return _meminfo('MemAvailable')

    # Misc
    def amp(self):
        return torch.cpu.amp

    def is_available(self):
        return True

    def range_push(self, msg):
        del msg

    def range_pop(self):
        pass

    def lazy_call(self, callback):
        return callback()

    # Data types
    def is_bf16_supported(self):
        return True

    def is_fp16_supported(self):
        return False

    def supported_dtypes(self):
        return [torch.float, torch.bfloat16]

    BFloat16Tensor = property(lambda self: torch.BFloat16Tensor)
    ByteTensor = property(lambda self: torch.ByteTensor)
    DoubleTensor = property(lambda self: torch.DoubleTensor)
    FloatTensor = property(lambda self: torch.FloatTensor)
    HalfTensor = property(lambda self: torch.HalfTensor)
    IntTensor = property(lambda self: torch.IntTensor)
    LongTensor = property(lambda self: torch.LongTensor)

    def pin_memory(self, tensor, align_bytes=1):
        del align_bytes
        return tensor

    def is_pinned(self, tensor):
        return tensor.is_pinned()

    def on_accelerator(self, tensor):
        return tensor.device.type == 'cpu'


class CUDA_Accelerator(_Accelerator):  # pylint: disable=invalid-name  - DeepSpeed's name
    """CUDA devices through torch.cuda, NCCL for collectives (DeepSpeed's CUDA accelerator)."""

    _name = 'cuda'
    _communication_backend_name = 'nccl'

    def is_synchronized_device(self):
        return False

    # Devices
    def device_name(self, device_index=None):
        return 'cuda' if device_index is None else f'cuda:{device_index}'

    def device(self, device_index=None):
        return torch.cuda.device(device_index)

    def set_device(self, device_index):
        torch.cuda.set_device(device_index)

    def current_device(self):
        return torch.cuda.current_device()

    def current_device_name(self):
        return f'cuda:{torch.cuda.current_device()}'

    def device_count(self):
        return torch.cuda.device_count()

    def synchronize(self, device_index=None):
        return torch.cuda.synchronize(device_index)

    # Random numbers
    def set_rng_state(self, new_state, device_index=None):
        if device_index is None:
            return torch.cuda.set_rng_state(new_state)
        return torch.cuda.set_rng_state(new_state, device_index)

    def get_rng_state(self, device_index=None):
        if device_index is None:
            return torch.cuda.get_rng_state()
        return torch.cuda.get_rng_state(device_index)

    def manual_seed(self, seed):
        return torch.cuda.manual_seed(seed)

    def manual_seed_all(self, seed):
        return torch.cuda.manual_seed_all(seed)

    def initial_seed(self):
        return torch.cuda.initial_seed()

    def default_generator(self, device_index):
        return torch.cuda.default_generators[device_index]

    # Streams and events
    Stream = property(lambda self: torch.cuda.Stream)
    Event = property(lambda self: torch.cuda.Event)

    def stream(self, stream):
        return torch.cuda.stream(stream)

    def current_stream(self, device_index=None):
        return torch.cuda.current_stream(device_index)

    def default_stream(self, device_index=None):
        return torch.cuda.default_stream(device_index)

    # Memory: the caching allocator's figures
    def empty_cache(self):
        return torch.cuda.empty_cache()

    def memory_allocated(self, device_index=None):
        return torch.cuda.memory_allocated(device_index)

    def max_memory_allocated(self, device_index=None):
        return torch.cuda.max_memory_allocated(device_index)

    def reset_max_memory_allocated(self, device_index=None):
        return torch.cuda.reset_peak_memory_stats(device_index)

    def memory_reserved(self, device_index=None):
        return torch.cuda.memory_reserved(device_index)

    def max_memory_reserved(self, device_index=None):
        return torch.cuda.max_memory_reserved(device_index)

    memory_cached = memory_reserved
    max_memory_cached = max_memory_reserved
    reset_max_memory_cached = reset_max_memory_allocated

    def memory_stats(self, device_index=None):
        return torch.cuda.memory_stats(device_index)

    def reset_peak_memory_stats(self, device_index=None):
        return torch.cuda.reset_peak_memory_stats(device_index)

    def total_memory(self, device_index=None):
        return torch.cuda.get_device_properties(device_index or torch.cuda.current_device()).total_memory

    def available_memory(self, device_index=None):
        free, _ = torch.cuda.mem_get_info(device_index)
        return free

    # Misc
    def amp(self):
        return torch.cuda.amp

    def is_available(self):
        return torch.cuda.is_available()

    def range_push(self, msg):
        return torch.cuda.nvtx.range_push(msg)

    def range_pop(self):
        return torch.cuda.nvtx.range_pop()

    def lazy_call(self, callback):
        return torch.cuda._lazy_call(callback)  # pylint: disable=protected-access  - as DeepSpeed's

    # Data types
    def is_bf16_supported(self):
        return torch.cuda.is_bf16_supported()

    def is_fp16_supported(self):
        major, _ = torch.cuda.get_device_capability()
        return major >= 7 or (major == 6 and os.environ.get('DS_ALLOW_DEPRECATED_FP16', '0') == '1')

    def supported_dtypes(self):
        dtypes = [torch.float]
        if self.is_fp16_supported():
            dtypes.append(torch.half)
        if self.is_bf16_supported():
            dtypes.append(torch.bfloat16)
        return dtypes

    BFloat16Tensor = property(lambda self: torch.cuda.BFloat16Tensor)
    ByteTensor = property(lambda self: torch.cuda.ByteTensor)
    DoubleTensor = property(lambda self: torch.cuda.DoubleTensor)
    FloatTensor = property(lambda self: torch.cuda.FloatTensor)
    HalfTensor = property(lambda self: torch.cuda.HalfTensor)
    IntTensor = property(lambda self: torch.cuda.IntTensor)
    LongTensor = property(lambda self: torch.cuda.LongTensor)

    def pin_memory(self, tensor, align_bytes=1):
        del align_bytes
        return tensor.pin_memory()

    def is_pinned(self, tensor):
        return tensor.is_pinned()

    def on_accelerator(self, tensor):
        return tensor.device.type == 'cuda'
