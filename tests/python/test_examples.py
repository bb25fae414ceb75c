"""The Python examples run end to end on a few steps and learn something."""
import os
import pathlib
import re
import subprocess
import sys

from conftest import launch

EXAMPLES = pathlib.Path(os.environ.get('PIPETRAIN_SOURCE_DIR', pathlib.Path(__file__).resolve().parents[2])) / \
    'examples' / 'python'


def test_gpipe_mnist_trains_on_two_partitions():
    result = subprocess.run([sys.executable, str(EXAMPLES / 'gpipe_mnist.py'), '--steps', '40', '--batch-size', '64'],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600, check=False)
    assert result.returncode == 0, result.stdout[-4000:]
    assert 'GPipe: balance [6, 5]' in result.stdout
    accuracy = float(re.search(r'test accuracy (\d\.\d+)', result.stdout).group(1))
    assert accuracy > 0.55, result.stdout  # ten classes: chance is 0.1


def test_deepspeed_style_gpt_trains_on_two_processes():
    result = launch(2, EXAMPLES / 'deepspeed_style_gpt.py', '--steps', '30', '--layers', '2', '--width', '64',
                    '--context', '32', time_limit=400)
    match = re.search(r'first loss (\d+\.\d+), last (\d+\.\d+), validation loss (\d+\.\d+)', result.stdout)
    assert match, result.stdout[-4000:]
    first, last, val = map(float, match.groups())
    assert last < first - 0.5 and val < first, result.stdout[-2000:]
