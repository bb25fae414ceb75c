"""Skip connections across partitions and stages (torchgpipe's pipetrain.skip API)."""
from .namespace import Namespace
from .skippable import Skippable, pop, skippable, stash, verify_skippables

__all__ = ['Namespace', 'Skippable', 'pop', 'skippable', 'stash', 'verify_skippables']
