"""deepspeed.add_config_arguments: the command-line flags DeepSpeed scripts add to their parser."""

__all__ = ['add_config_arguments']


def add_config_arguments(parser):
    """Adds DeepSpeed's argument group to an argparse parser and returns the parser, as
    DeepSpeed's does: ``--deepspeed`` and ``--deepscale`` (flags for the script's own use),
    ``--deepspeed_config`` and the older ``--deepscale_config`` (the JSON file that
    ``initialize(args=args)`` reads)."""
    group = parser.add_argument_group('DeepSpeed', 'DeepSpeed configurations')
    group.add_argument('--deepspeed', default=False, action='store_true',
                       help='a flag for the script to read; changes nothing in the engine')
    group.add_argument('--deepspeed_config', default=None, type=str,
                       help='the DeepSpeed JSON config that initialize(args=args) reads')
    group.add_argument('--deepscale', default=False, action='store_true', help='deprecated name of --deepspeed')
    group.add_argument('--deepscale_config', default=None, type=str, help='deprecated name of --deepspeed_config')
    return parser
