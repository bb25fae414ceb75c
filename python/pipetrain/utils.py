"""Helpers DeepSpeed scripts import from deepspeed.utils: RepeatingLoader, logger, log_dist."""
import logging
import os
import sys

import torch.distributed

from . import _C
from .errors import PipelineError
from .pipe import RepeatingLoader

__all__ = ['RepeatingLoader', 'logger', 'log_dist']

# The variables by which a launcher (torchrun or `pipetrain launch`, mpirun, srun, MPICH) tells a
# process its rank; with none of them set the process runs alone.
_RANK_VARIABLES = ('RANK', 'OMPI_COMM_WORLD_RANK', 'PMI_RANK', 'SLURM_PROCID')


def _make_logger():
    # As DeepSpeed's: named "DeepSpeed", INFO, its own stdout handler, no propagation to root.
    made = logging.getLogger('DeepSpeed')
    made.setLevel(logging.INFO)
    made.propagate = False
    if not made.handlers:
        handler = logging.StreamHandler(stream=sys.stdout)
        handler.setLevel(logging.INFO)
        handler.setFormatter(logging.Formatter(
            '[%(asctime)s] [%(levelname)s] [%(filename)s:%(lineno)d:%(funcName)s] %(message)s'))
        made.addHandler(handler)
    return made


logger = _make_logger()


def _rank():
    """This process's rank, or -1 when it runs alone (DeepSpeed's value before init_distributed).
    pipetrain's engine connects the ranks without torch.distributed, so the launcher's
    environment counts as initialised too."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    if not any(v in os.environ for v in _RANK_VARIABLES):
        return -1
    try:
        return _C.rank_info()[0]
    except PipelineError:
        # An environment the engine would refuse (no MASTER_ADDR, say) still names the rank.
        return next(int(os.environ[v]) for v in _RANK_VARIABLES if v in os.environ)


def log_dist(message, ranks=None, level=logging.INFO):
    """Logs ``message`` as "[Rank r] message" on the ranks listed in ``ranks`` (``[-1]``: all
    ranks; None or []: none), and on every process that runs alone (DeepSpeed's rule)."""
    rank = _rank()
    ranks = list(ranks or [])
    if rank == -1 or (ranks and (ranks[0] == -1 or rank in ranks)):
        logger.log(level, f'[Rank {rank}] {message}')
